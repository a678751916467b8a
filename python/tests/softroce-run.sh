#!/usr/bin/env bash
# softroce-run.sh - the Python module's tests over RDMA verbs, inside a Soft-RoCE QEMU
# guest (tests/softroce/run-guest.sh): the interpreter of a virtual environment that has
# gpu_rdma, numpy and pytest installed (`pip install ./python pytest numpy`), its standard
# library (less its tests, IDLE and tkinter) and the environment's packages go into the
# guest, which runs test_transfer.py against its rxe address with transport="rdma"
# (the tests marked tcp_only deselected). Exit code: pytest's, or run-guest.sh's.
#
#   python/tests/softroce-run.sh [VENV]     (default: target/python-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-target/python-venv}
PY="$VENV/bin/python"
[[ -x $PY ]] || { echo "softroce-run.sh: no virtual environment at $VENV" >&2; exit 2; }
"$PY" -c 'import gpu_rdma, numpy, pytest' || {
  echo "softroce-run.sh: $VENV lacks gpu_rdma, numpy or pytest" >&2; exit 2; }
# The interpreter's own paths, as this machine has them: the guest gets them at the same
# places, so nothing in them needs rewriting.
read -r EXE HOME_ STDLIB SITE < <("$PY" -c 'import os, sys, sysconfig
print(os.path.realpath(sys.executable), sys.base_prefix, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])')
STAGE=target/softroce-python
rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/stdlib" "$STAGE/site"
cp -L "$EXE" "$STAGE/bin/python3"
# The standard library less what the tests never import (and its own site-packages).
(cd "$STDLIB" && find . \( -name __pycache__ -o -name site-packages -o -name test -o -name idlelib \
   -o -name tkinter -o -name turtledemo -o -name ensurepip -o -name lib2to3 -o -name 'config-3.*' \) -prune \
   -o -print0 | cpio --null -pdm --quiet "$OLDPWD/$STAGE/stdlib")
# The environment's packages less the installers.
(cd "$SITE" && find . \( -name __pycache__ -o -name 'pip' -o -name 'pip-*' -o -name setuptools \
   -o -name 'setuptools-*' -o -name pkg_resources -o -name _distutils_hack \) -prune \
   -o -print0 | cpio --null -pdm --quiet "$OLDPWD/$STAGE/site")
echo "softroce-run.sh: $(du -sh "$STAGE" | cut -f1) of Python into the guest ($EXE, $STDLIB, $SITE)" >&2
exec tests/softroce/run-guest.sh --timeout "${TIMEOUT:-600}" --qemu-arg -cpu --qemu-arg max \
  --bin "$STAGE/bin/python3" \
  --tree "$STAGE/stdlib=$STDLIB" --tree "$STAGE/site=/opt/site" --tree "python/tests=/opt/pytests" \
  --env "PY_HOME=$HOME_" --env PY_SITE=/opt/site --env PY_TESTS=/opt/pytests \
  -- python/tests/softroce-guest.sh
