#!/usr/bin/env bash
# Seventh session (2026-12-07 morning), main 7d51445, call 1: the GPU tests, the endpoint
# example, the outside crate from GPU memory, the Python module's CUDA tests and its bench
# against torch.distributed over NCCL's Socket and the CLI (python/tests/h200-run.sh),
# then the NCCL plugin under PyTorch's NCCL against NET/Socket at NCCL's defaults and with faults.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -5
timeout 60 target/dev/endpoint 100 > $OUT/endpoint.log 2>&1; echo "endpoint rc=$?"; tail -3 $OUT/endpoint.log
timeout 60 target/dev/outside-crate > $OUT/outside-crate.log 2>&1; echo "outside crate rc=$?"; tail -3 $OUT/outside-crate.log
WHEELS=target/dev/wheels HOST_BIN=target/dev/host OUT=$OUT/python timeout 230 bash python/tests/h200-run.sh > $OUT/python-run.log 2>&1; echo "python rc=$?"
grep -E "passed|failed" $OUT/python-run.log | tail -2
python3 - $OUT/python-run.log <<'PY'
import re,sys
t=open(sys.argv[1]).read()
for k in ("module","cli","nccl_socket","module_over_socket","module_over_cli_same_work"):
    print(k, re.findall(r'"%s": ([0-9.]+)'%k, t))
PY
mkdir -p $OUT/nccl
RUNS="socket-default grdma-default grdma-faults-1e3" MAX_BYTES=256MiB PLUGIN=$PWD/target/dev/plugin/libnccl-net-grdma.so OUT=$OUT/nccl timeout 200 bash tests/nccl/h200-run.sh > $OUT/nccl/run.log 2>&1; echo "nccl rc=$?"; tail -12 $OUT/nccl/run.log
cd $OUT && tar czf python.tgz python && rm -rf python
