#!/usr/bin/env bash
# Main at 403f857 (sixth session): the GPU tests, the endpoint example, the Python module's CUDA tests,
# then the NCCL plugin under PyTorch's NCCL against NET/Socket at NCCL's defaults, and with faults.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
timeout 100 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -5
timeout 60 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "endpoint rc=$?"; tail -3 $OUT/endpoint.log
SITE=/tmp/gpu-rdma-site; rm -rf $SITE; mkdir -p $SITE; for w in target/dev/wheels/*.whl; do python3 -m zipfile -e "$w" $SITE; done
PYTHONPATH=$SITE timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_cuda.py > $OUT/test_cuda.log 2>&1; echo "test_cuda rc=$?"; tail -2 $OUT/test_cuda.log
mkdir -p $OUT/nccl
RUNS="socket-default grdma-default grdma-faults-1e3" MAX_BYTES=256MiB PLUGIN=$PWD/target/dev/plugin/libnccl-net-grdma.so OUT=$OUT/nccl timeout 240 bash tests/nccl/h200-run.sh > $OUT/nccl/run.log 2>&1; echo "nccl rc=$?"; tail -12 $OUT/nccl/run.log
