#!/usr/bin/env bash
# Eighth session, call 5 (warm): GPU to GPU against host to host, two more rounds; the Python module's run again (its bench varies by call).
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/ns
HOST_BIN=target/dev/host LOG=$OUT/ns/scaling timeout 250 tests/gpu-tcp-scaling.sh 2 > $OUT/ns/scaling.json 2> $OUT/ns/scaling.err; echo "scaling rc=$?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(k, v["gpu_to_gpu"], v["host_to_host"], v["median_ratio"]) for k,v in d["streams"].items()]' $OUT/ns/scaling.json
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 230 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$?"
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","cli","cli_same_work","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
cd $OUT && tar czf ns.tgz ns python && rm -rf ns python
