#!/usr/bin/env bash
# Is NCCL's default pipeline (8 x 128 KiB per channel) bound by the sender waiting for the ack?
# send/recv at NCCL's defaults: checks on, checks off (done when written), alternated twice.
set -u
P=$PWD/target/plugin/libnccl-net-grdma.so
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 120 python3 tests/nccl/torch_bench.py --label $label --out $OUT/$label.json --ops send_recv --min-bytes 64KiB > $OUT/$label.log 2>&1 || echo "$label failed"; }
G=(NCCL_NET_PLUGIN=$P NCCL_NET=grdma)
for r in 1 2; do
  b on-$r "${G[@]}"
  b off-$r "${G[@]}" NCCL_GRDMA_CHECKS=0
  b sock-$r NCCL_NET=Socket
done
b trace-on "${G[@]}" NCCL_GRDMA_TRACE=1
python3 - $OUT <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
ls=sorted(runs); print("bytes", *ls)
for s in sorted(runs[ls[0]]): print(s, *["%.3f"%runs[l].get(s,0) for l in ls])
PY
cd $OUT && gzip -f trace-on.log && tar czf logs.tgz *.log && rm -f *.log
