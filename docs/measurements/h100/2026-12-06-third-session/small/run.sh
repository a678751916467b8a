#!/usr/bin/env bash
# Small CUDA tensors through the Python module, before (old: c7c39e6) and after (new:
# bb31349, the listener's pause no longer waits out the accept poll), alternated.
set -u
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
for v in old new; do rm -rf /tmp/site-$v; mkdir -p /tmp/site-$v; python3 -m zipfile -e target/small/$v/*.whl /tmp/site-$v; done
for r in 1 2; do for v in old new; do for size in 1MiB; do
  PYTHONPATH=/tmp/site-$v timeout 60 python3 python/bench/gpu_bench.py --size $size --streams 1,4 --iters 30 > $OUT/$v-$size-$r.json 2>$OUT/$v-$size-$r.err
  python3 - $OUT/$v-$size-$r.json $v $size $r <<'PY'
import json,sys,statistics as st
d=json.load(open(sys.argv[1]))
for s,x in d["runs"].items():
    ph=x["phases"][1:]
    print(sys.argv[2], sys.argv[3], "round", sys.argv[4], "streams", s, "wall ms median %.3f" % (1e3*st.median(p["wall_s"] for p in ph)),
          "round trip ms median %.3f" % (1e3*st.median(p["round_trip_s"] for p in ph)), "exact", x["exact"])
PY
done; done; done
cd $OUT && tar czf small.tgz *.json *.err && rm -f *.json *.err
