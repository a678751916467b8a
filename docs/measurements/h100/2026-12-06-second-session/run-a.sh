#!/usr/bin/env bash
# HEAD's plugin under PyTorch (the six runs of h200-run.sh) and the host crate's GPU tests.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
mkdir -p $OUT/six
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
echo "== gpu tests"
timeout 240 target/dev/gpu-tests --test-threads 1 > $OUT/gpu-tests.log 2>&1; echo "rc=$?"
grep -E "^test result|FAILED|panicked|SKIPPED" $OUT/gpu-tests.log | head -10
echo "== six runs"
OUT=$OUT/six PLUGIN=$PWD/target/ab/crcfast.so timeout 330 bash tests/nccl/h200-run.sh > $OUT/six.txt 2>&1; echo "rc=$?"
tail -14 $OUT/six.txt
cd $OUT && tar czf six.tgz six && rm -rf six
