#!/usr/bin/env bash
# An A/B of NCCL net transports or plugin builds under PyTorch on a GPU machine: each
# configuration runs tests/nccl/torch_bench.py in turn, ROUNDS times alternated (the
# device lends a different machine per call and its figures drift: compare only within
# one run of this script). Each configuration is a label and the environment it runs
# with; every result must be bit-exact.
#
#   tests/nccl/ab.sh main "NCCL_NET_PLUGIN=/p/old.so NCCL_NET=grdma" \
#                    new  "NCCL_NET_PLUGIN=/p/new.so NCCL_NET=grdma" \
#                    socket "NCCL_NET=Socket"
#   ROUNDS=3 OPS=send_recv MIN_BYTES=16MiB MAX_BYTES=1GiB OUT=dir tests/nccl/ab.sh ...
#
# Writes <label>-<round>.json and .log.gz under OUT (target/nccl-ab), prints one line
# per run (GB/s per size, smallest first) and exits 1 if a run failed or was not exact.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
OUT="${OUT:-$PWD/target/nccl-ab}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
PY="${PYTHON:-python3}"
fail=0
for r in $(seq 1 "${ROUNDS:-2}"); do
    args=("$@")
    for ((i = 0; i < ${#args[@]}; i += 2)); do
        label="${args[i]}-$r"
        read -r -a envs <<<"${args[i + 1]}"
        if ! env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "${envs[@]}" timeout "${RUN_TIMEOUT:-300}" \
            "$PY" tests/nccl/torch_bench.py --label "$label" --out "$OUT/$label.json" \
            --ops "${OPS:-send_recv}" --min-bytes "${MIN_BYTES:-1MiB}" --max-bytes "${MAX_BYTES:-1GiB}" \
            >"$OUT/$label.log" 2>&1; then
            echo "ab: $label FAILED (see $OUT/$label.log.gz)"; fail=1
        fi
        gzip -f "$OUT/$label.log"
    done
done
"$PY" - "$OUT" <<'PYEOF' || fail=1
import json, os, sys
out, bad = sys.argv[1], False
for f in sorted(os.listdir(out)):
    if not f.endswith(".json"):
        continue
    with open(os.path.join(out, f)) as fh:
        d = json.load(fh)
    rs = sorted(d["results"], key=lambda r: (r["op"], r["bytes"]))
    bad |= not all(r["exact"] for r in rs)
    print(f'{d["label"]:<20}', " ".join(f'{r["op"]}/{r["bytes"]}={r["GBps"]:.3f}' for r in rs))
sys.exit(1 if bad else 0)
PYEOF
exit $fail
