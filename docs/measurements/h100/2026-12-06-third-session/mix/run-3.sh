#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt
SITE=/tmp/gpu-rdma-site; rm -rf $SITE; mkdir -p $SITE
for w in target/dev/wheels/*.whl; do python3 -m zipfile -e "$w" "$SITE"; done
export PYTHONPATH=$SITE
timeout 200 python3 target/dev/mix.py $PWD/target/dev/host $OUT 2>&1 | tee $OUT/mix.json
echo "== baselines on this machine"
timeout 100 python3 python/bench/gpu_bench.py --size 1GiB --streams 8,4 --iters 5 > $OUT/module.json 2>$OUT/module.err
python3 -c "
import json; d=json.load(open('$OUT/module.json'))
for s,r in d['runs'].items(): print('module->module', s, [(p['wall_s'],p['data_s'],p['round_trip_s']) for p in r['phases']])"
target/dev/host recv --transport tcp --mem device --bind 127.0.0.1 --port 7594 --max-bytes 2GiB --max-memory 64GiB --timeout 60 > $OUT/cli-recv.log 2>&1 &
RP=$!; for _ in $(seq 300); do grep -q "listening on" $OUT/cli-recv.log && break; sleep 0.1; done
for s in 8 4; do timeout 60 target/dev/host 127.0.0.1 7594 --mem staged --transport tcp --size 1GiB --streams $s --iters 5 --reuse-connection --verify checksum --timeout 60 --json > $OUT/cli-$s.json 2>$OUT/cli-$s.err
python3 -c "
import json; its=json.load(open('$OUT/cli-$s.json'))['iterations']; print('cli->cli', $s, [(round(i['seconds'],4), round(i['round_trip_seconds'],4)) for i in its])"; done
kill $RP
