#!/usr/bin/env bash
# Tuned (2 MiB chunks, 16 MiB buffers, 4 streams / 4 threads x 1 socket): the last build with
# its eager limit (1 MiB: 2 MiB steps wait for the clear-to-send) against NCCL_GRDMA_EAGER_MAX=2 MiB
# (they go eagerly, into the pool), and Socket; send/recv 16 MiB..1 GiB, two rounds.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
A=$PWD/target/ab
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
mkdir -p $OUT/ab
T=(NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216)
G=(NCCL_NET_PLUGIN=$A/libnccl-net-grdma-final.so NCCL_NET=grdma NCCL_GRDMA_STREAMS=4)
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv --min-bytes 16MiB > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
for r in 1 2; do
  b t-final-$r "${G[@]}" "${T[@]}"
  b t-eager2m-$r "${G[@]}" "${T[@]}" NCCL_GRDMA_EAGER_MAX=2097152
  b t-socket-$r NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4 "${T[@]}"
done
python3 - $OUT/ab <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
        assert all(r["exact"] for r in d["results"]), f
for l in sorted(runs): print("%-14s"%l, *["%.2f"%runs[l][s] for s in sorted(runs[l])])
PY
cd $OUT && gzip ab/*.log && tar czf ab.tgz ab && rm -rf ab
