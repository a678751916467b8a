#!/usr/bin/env bash
# The Python module on a machine with a CUDA GPU and torch (the H200): its CUDA tests,
# then GPU to GPU at 1 GiB over loopback TCP at 1, 4 and 8 streams against the command
# line (`host`, GPU to GPU, the same streams) and torch.distributed send/recv over NCCL's
# Socket transport at as many data sockets (two ranks on the one GPU, a different
# NCCL_HOSTID each), tuned (2 MiB chunks, 16 MiB buffers, channels x threads = sockets),
# all in one run. Logs and JSON to $OUT (default target/python-h200).
#
#   WHEELS=dir-with-gpu_rdma-and-pytest-wheels HOST_BIN=path/to/host python/tests/h200-run.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-target/python-h200}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/gpu-rdma-site}

# torch comes from the machine's Python (wherever it installed it: a virtual environment
# would not see a user site); the module and pytest from the wheels, unpacked (a wheel
# is a zip of what site-packages holds) onto PYTHONPATH, so no pip is needed either.
rm -rf "$SITE" && mkdir -p "$SITE"
for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" "$SITE" || exit 1; done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
V="$PY"
"$V" -c 'import torch, gpu_rdma; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'

echo "==> pytest python/tests/test_cuda.py"
"$V" -m pytest -v -s -p no:cacheprovider python/tests/test_cuda.py 2>&1 | tee "$OUT/pytest-cuda.log"
rc_tests=${PIPESTATUS[0]}

echo "==> gpu_rdma GPU to GPU, 1 GiB, streams 1,4,8"
"$V" python/bench/gpu_bench.py --size 1GiB --streams 1,4,8 --iters 5 > "$OUT/module.json" 2> "$OUT/module.err"
rc_bench=$?
cat "$OUT/module.json"

echo "==> host (the command line), GPU to GPU, 1 GiB, streams 1,4,8"
"$HOST_BIN" recv --transport tcp --mem device --bind 127.0.0.1 --port 7591 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > "$OUT/cli-recv.log" 2>&1 &
RPID=$!
trap 'kill "$RPID" 2>/dev/null' EXIT
for _ in $(seq 300); do grep -q "listening on" "$OUT/cli-recv.log" && break; sleep 0.1; done
for s in 1 4 8; do
    timeout 120 "$HOST_BIN" 127.0.0.1 7591 --mem staged --transport tcp --size 1GiB --streams "$s" \
        --iters 5 --timeout 60 --json > "$OUT/cli-$s.json" 2> "$OUT/cli-$s.err" || echo "cli $s streams failed: $(tail -2 "$OUT/cli-$s.err")"
done
# The same work as the module's sends: CRC32C of every chunk on both GPUs (`--verify
# checksum`), every transfer after the first on the kept connection (`--reuse-connection`),
# timed to the receiver's ack (the round trip), as the module's wall time is.
for s in 1 4 8; do
    timeout 120 "$HOST_BIN" 127.0.0.1 7591 --mem staged --transport tcp --size 1GiB --streams "$s" \
        --iters 5 --reuse-connection --verify checksum --timeout 60 --json > "$OUT/cli-checksum-kept-$s.json" \
        2> "$OUT/cli-checksum-kept-$s.err" || echo "cli checksum kept $s streams failed: $(tail -2 "$OUT/cli-checksum-kept-$s.err")"
done
kill "$RPID" 2>/dev/null

echo "==> torch.distributed send/recv over NCCL's Socket transport, 1 GiB, tuned, 1/4/8 sockets"
for spec in "1 1 1" "4 1 4" "8 2 4"; do
    set -- $spec
    env NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216 \
        NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS="$3" NCCL_NCHANNELS_PER_NET_PEER="$2" \
        NCCL_MIN_NCHANNELS="$2" NCCL_MAX_NCHANNELS="$2" \
        timeout 300 "$V" tests/nccl/torch_bench.py --out "$OUT/socket-$1.json" --label "socket-$1" \
        --ops send_recv --min-bytes 1GiB --max-bytes 1GiB > "$OUT/socket-$1.log" 2>&1 \
        || echo "socket $1 failed: $(tail -3 "$OUT/socket-$1.log")"
done

"$V" - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
module_doc = json.load(open(f"{out}/module.json"))
module, n = module_doc["runs"], module_doc["bytes"]
rows = {}
for s in ("1", "4", "8"):
    row = {"module": module.get(s, {}).get("median"), "module_exact": module.get(s, {}).get("exact")}
    try:
        row["cli"] = json.load(open(f"{out}/cli-{s}.json"))["aggregate"]["gb_per_s"]
    except Exception as e:
        row["cli"] = None
    try:
        its = json.load(open(f"{out}/cli-checksum-kept-{s}.json"))["iterations"]
        rts = sorted(i["bytes"] / i["round_trip_seconds"] / 1e9 for i in its if i.get("round_trip_seconds"))
        row["cli_checksum_kept_round_trip"] = round(rts[len(rts) // 2], 3)
    except Exception as e:
        row["cli_checksum_kept_round_trip"] = None
    m = module.get(s, {}).get("phases") or []
    if m:
        rts = sorted(n / p["round_trip_s"] / 1e9 for p in m if p["round_trip_s"])
        row["module_round_trip"] = round(rts[len(rts) // 2], 3) if rts else None
    try:
        r = json.load(open(f"{out}/socket-{s}.json"))
        sr = [x for x in r["results"] if x["op"] == "send_recv"][-1]
        row["nccl_socket"] = sr.get("GBps")
        row["nccl_exact"] = sr.get("exact")
    except Exception as e:
        row["nccl_socket"] = None
    if row["module"] and row.get("nccl_socket"):
        row["module_over_socket"] = round(row["module"] / row["nccl_socket"], 2)
    if row["module"] and row.get("cli"):
        row["module_over_cli"] = round(row["module"] / row["cli"], 2)
    if row["module"] and row.get("cli_checksum_kept_round_trip"):
        row["module_over_cli_same_work"] = round(row["module"] / row["cli_checksum_kept_round_trip"], 2)
    rows[s] = row
print(json.dumps({"streams": rows}, indent=1))
json.dump({"streams": rows}, open(f"{out}/summary.json", "w"), indent=1)
PYEOF
echo "pytest rc=$rc_tests bench rc=$rc_bench"
exit $(( rc_tests || rc_bench ))
