#!/usr/bin/env bash
# The library's endpoint example (100 transfers), the Python module's CUDA tests and its
# bench against the CLI and NCCL Socket (python/tests/h200-run.sh).
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
echo "== endpoint example"
timeout 90 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "rc=$?"; tail -3 $OUT/endpoint.log
echo "== python"
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 420 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "rc=$?"
grep -E "passed|failed|error" $OUT/python-run.log | tail -8
tail -30 $OUT/python-run.log
