#!/usr/bin/env bash
# The final build (main 60b3e57): tests/nccl/h200-run.sh's six runs, then send/recv at the
# defaults twice more alternated with Socket.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
A=$PWD/target/ab
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
OUT=$OUT/six PLUGIN=$A/libnccl-net-grdma-final.so timeout 330 bash tests/nccl/h200-run.sh > $OUT/six.txt 2>&1; echo "six rc=$?"
grep -h "largest size\|FAILED\|never says\|repaired" $OUT/six.txt
mkdir -p $OUT/ab
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 150 python3 tests/nccl/torch_bench.py --label $label --out $OUT/ab/$label.json --ops send_recv --min-bytes 16MiB > $OUT/ab/$label.log 2>&1 || echo "$label failed"; }
for r in 1 2; do
  b final-$r NCCL_NET_PLUGIN=$A/libnccl-net-grdma-final.so NCCL_NET=grdma
  b socket-$r NCCL_NET=Socket
done
python3 - $OUT/ab <<'PY'
import json,sys,os
o=sys.argv[1]; runs={}
for f in sorted(os.listdir(o)):
    if f.endswith(".json"):
        d=json.load(open(os.path.join(o,f))); runs[d["label"]]={r["bytes"]:r["GBps"] for r in d["results"]}
        assert all(r["exact"] for r in d["results"]), f
for l in sorted(runs): print("%-10s"%l, *["%.3f"%runs[l][s] for s in sorted(runs[l])])
PY
cd $OUT && gzip six/*.log ab/*.log && tar czf final.tgz six ab && rm -rf six ab
