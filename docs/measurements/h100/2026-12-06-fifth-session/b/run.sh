#!/usr/bin/env bash
# Main at d07e2ea (fifth session, second run): the GPU tests, the endpoint example, the Python module's CUDA tests (the DLPack 1.0 path).
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
timeout 100 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -5
timeout 60 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "endpoint rc=$?"; tail -3 $OUT/endpoint.log
SITE=/tmp/gpu-rdma-site; rm -rf $SITE; mkdir -p $SITE; for w in target/dev/wheels/*.whl; do python3 -m zipfile -e "$w" $SITE; done
PYTHONPATH=$SITE timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_cuda.py > $OUT/test_cuda.log 2>&1; echo "test_cuda rc=$?"; tail -2 $OUT/test_cuda.log
