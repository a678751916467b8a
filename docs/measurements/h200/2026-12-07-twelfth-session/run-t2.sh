#!/usr/bin/env bash
# Eleventh session, call 2: the NCCL plugin under PyTorch's NCCL against NET/Socket, every
# configuration (defaults, tuned, tuned with the checks off, faults at 1 in 1000), every
# op, 1 KiB to 1 GiB (tests/nccl/h200-run.sh with its defaults).
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "plugin of $(cat target/dev/plugin/commit.txt 2>/dev/null || cat target/dev/commit.txt)"
PLUGIN=$PWD/target/dev/plugin/libnccl-net-grdma.so OUT=$OUT/nccl timeout 570 bash tests/nccl/h200-run.sh > $OUT/run.log 2>&1; echo "nccl rc=$?"; grep -E "h200-run:" $OUT/run.log | tail -24
cd $OUT && tar czf nccl.tgz nccl && rm -rf nccl
