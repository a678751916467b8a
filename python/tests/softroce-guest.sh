# softroce-guest.sh - runs INSIDE a Soft-RoCE guest (busybox sh), started by
# python/tests/softroce-run.sh: the Python tests over RDMA verbs on the guest's rxe
# address. PY_HOME (the interpreter's prefix), PY_SITE (the packages) and PY_TESTS (the
# test files) come from run-guest.sh's --env.
set -u
export PYTHONHOME="$PY_HOME" PYTHONPATH="$PY_SITE" PYTHONDONTWRITEBYTECODE=1
export GPU_RDMA_TEST_HOST="$RXE_ADDR" GPU_RDMA_TEST_TRANSPORT=rdma
# The module's TCP side listens too (a listener serves both), so loopback must be up.
/usr/bin/ip link set lo up
cd /tmp
python3 -c 'import gpu_rdma, numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__, "gpu_rdma from", gpu_rdma.__file__)' || exit 1
/usr/bin/rdma link show
python3 -m pytest -v -rs -p no:cacheprovider -m "not tcp_only" "$PY_TESTS/test_transfer.py"
