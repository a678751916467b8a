#!/usr/bin/env bash
# Tuned (2 MiB chunks, 16 MiB buffers, 4 streams / 4 threads x 1 socket): main, kept copies
# up to 256 KiB, up to 2 MiB; and NCCL's defaults once more; send/recv 16 MiB..1 GiB; alternated.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
mkdir -p $OUT/ab
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv --min-bytes 16MiB > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
T=(NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216)
A=$PWD/target/ab
for r in 1 2; do
  b t-main-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-main.so NCCL_NET=grdma NCCL_GRDMA_STREAMS=4 "${T[@]}"
  b t-kept-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-new.so NCCL_NET=grdma NCCL_GRDMA_STREAMS=4 "${T[@]}"
  b t-kept2m-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-kept2m.so NCCL_NET=grdma NCCL_GRDMA_STREAMS=4 "${T[@]}"
  b t-socket-$r NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4 "${T[@]}"
  b d-main-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-main.so NCCL_NET=grdma
  b d-kept-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-new.so NCCL_NET=grdma
  b d-socket-$r NCCL_NET=Socket
done
python3 - $OUT/ab <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
        assert all(r["exact"] for r in d["results"]), f
ls=sorted(runs)
for l in ls: print("%-14s"%l, *["%.2f"%runs[l][s] for s in sorted(runs[l])])
PY
cd $OUT && tar czf ab.tgz ab && rm -rf ab
