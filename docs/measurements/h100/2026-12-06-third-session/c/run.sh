#!/usr/bin/env bash
# Session 3, call 4 (main after c7c39e6): the GPU tests, then a second sample of the
# Python module against the CLI and NCCL Socket (python/tests/h200-run.sh).
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt
timeout 120 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -10
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 300 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$?"
grep -E "passed|failed" $OUT/python-run.log | tail -3
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","module_round_trip","cli","cli_checksum_kept_round_trip","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
cd $OUT && tar czf python.tgz python && rm -rf python
