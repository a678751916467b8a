#!/usr/bin/env bash
# With kept copies (sends of <= 256 KiB done once written): eager by number on / off,
# NCCL's defaults, send/recv 4 KiB..1 GiB, three rounds alternated with Socket.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
A=$PWD/target/ab
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
mkdir -p $OUT/ab
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv --min-bytes 4KiB > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
G=(NCCL_NET_PLUGIN=$A/libnccl-net-grdma-new.so NCCL_NET=grdma)
for r in 1 2 3; do
  b kept-$r "${G[@]}"
  b kept-number-$r "${G[@]}" NCCL_GRDMA_EAGER_BY_NUMBER=1
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
for l in ls: print("%-16s"%l, *["%.3f"%runs[l][s] for s in sorted(runs[l])])
PY
cd $OUT && gzip ab/*.log && tar czf ab.tgz ab && rm -rf ab
