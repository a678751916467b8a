#!/usr/bin/env bash
# A/B: main's plugin (sends done at the ack) against kept copies (small sends done once
# written), NCCL's defaults, send/recv 1 KiB..1 GiB, alternated twice with Socket; then
# the new build through h200-run.sh's six runs.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
mkdir -p $OUT/ab
for r in 1 2; do
  b main-$r NCCL_NET_PLUGIN=$PWD/target/ab/libnccl-net-grdma-main.so NCCL_NET=grdma
  b kept-$r NCCL_NET_PLUGIN=$PWD/target/ab/libnccl-net-grdma-new.so NCCL_NET=grdma
  b socket-$r NCCL_NET=Socket
done
python3 - $OUT/ab <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
        assert all(r["exact"] for r in d["results"]), f
ls=sorted(runs); print("bytes", *ls)
for s in sorted(runs[ls[0]]): print(s, *["%.3f"%runs[l].get(s,0) for l in ls])
PY
OUT=$OUT/six PLUGIN=$PWD/target/ab/libnccl-net-grdma-new.so timeout 330 bash tests/nccl/h200-run.sh > $OUT/six.txt 2>&1; echo "six rc=$?"
grep -h "largest size\|FAILED\|never says\|repaired" $OUT/six.txt
cd $OUT && tar czf ab.tgz ab six && rm -rf ab six
