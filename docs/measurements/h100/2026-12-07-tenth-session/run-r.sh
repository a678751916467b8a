#!/usr/bin/env bash
# Ran on main 7830b95's plugin; NCCL_GRDMA_EAGER_PARK_MS and NCCL_GRDMA_KEEP_MAX were removed after it (README).
# Tenth session: the plugin at NCCL's tuned settings, eager messages parked in the kernel
# until their receive is posted (NCCL_GRDMA_EAGER_PARK_MS) against main's clear-to-send
# wait and against NET/Socket, alternated in rounds (tests/nccl/ab.sh); then the same at
# NCCL's defaults; then a trace of the parked run.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "binaries of $(cat target/dev/commit.txt)"
P=$PWD/target/dev/plugin/libnccl-net-grdma.so
T="NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
G="NCCL_NET_PLUGIN=$P NCCL_NET=grdma"
PARK="NCCL_GRDMA_EAGER_BY_NUMBER=1 NCCL_GRDMA_EAGER_PARK_MS=20"
ROUNDS=1 MIN_BYTES=64MiB MAX_BYTES=1GiB OUT=$OUT/tuned timeout 200 bash tests/nccl/ab.sh \
  socket "NCCL_NET=Socket $T NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4" \
  main "$G NCCL_GRDMA_STREAMS=4 $T" \
  park "$G NCCL_GRDMA_STREAMS=4 $T NCCL_GRDMA_EAGER_MAX=4194304 $PARK" \
  park-keep "$G NCCL_GRDMA_STREAMS=4 $T NCCL_GRDMA_EAGER_MAX=4194304 $PARK NCCL_GRDMA_KEEP_MAX=2097152" \
  2>&1 | tail -12; echo "tuned rc=${PIPESTATUS[0]}"
