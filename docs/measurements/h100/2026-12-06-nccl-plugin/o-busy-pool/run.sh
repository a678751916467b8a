#!/usr/bin/env bash
# A bounce pool that keeps up to 16 MiB / 128 buffers while eager messages come, 4 MiB / 32
# once idle for 1 s (pool), against the kept-copies build that keeps 4 MiB / 32 always (kept):
# NCCL's defaults, send/recv 1 MiB..1 GiB, three rounds alternated with Socket.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
A=$PWD/target/ab
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
mkdir -p $OUT/ab
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv --min-bytes 1MiB > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
for r in 1 2 3; do
  b kept-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-new.so NCCL_NET=grdma
  b pool-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-pool.so NCCL_NET=grdma
  b socket-$r NCCL_NET=Socket
done
python3 - $OUT/ab <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
        assert all(r["exact"] for r in d["results"]), f
ls=sorted(runs)
for l in ls: print("%-10s"%l, *["%.3f"%runs[l][s] for s in sorted(runs[l])])
PY
cd $OUT && gzip ab/*.log && tar czf ab.tgz ab && rm -rf ab
