#!/usr/bin/env bash
# Session 3, call 2: the plugin at HEAD (head.so) under PyTorch: eager messages placed by
# number (in place where the receive is posted) against the default path and Socket,
# tuned (2 MiB steps eager) and at NCCL's defaults; then a trace of the in-place run.
set -u
A=$PWD/target/ab
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt
T="NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
G="NCCL_NET=grdma NCCL_GRDMA_STREAMS=4 NCCL_NET_PLUGIN=$A/head.so"
t0=$(date +%s)
ROUNDS=2 OUT=$OUT/tuned MIN_BYTES=16MiB RUN_TIMEOUT=80 timeout 330 bash tests/nccl/ab.sh \
  match "$T $G" \
  bynumber "$T $G NCCL_GRDMA_EAGER_BY_NUMBER=1 NCCL_GRDMA_EAGER_MAX=2097152" \
  socket "$T NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4" 2>&1 | tee $OUT/tuned.txt
echo "tuned $(( $(date +%s)-t0 ))s"; t0=$(date +%s)
ROUNDS=1 OUT=$OUT/default MIN_BYTES=4MiB RUN_TIMEOUT=80 timeout 150 bash tests/nccl/ab.sh \
  match "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/head.so" \
  bynumber "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/head.so NCCL_GRDMA_EAGER_BY_NUMBER=1" \
  socket "NCCL_NET=Socket" 2>&1 | tee $OUT/default.txt
echo "default $(( $(date +%s)-t0 ))s"
env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET $T $G NCCL_GRDMA_EAGER_BY_NUMBER=1 NCCL_GRDMA_EAGER_MAX=2097152 NCCL_GRDMA_TRACE=1 timeout 60 \
  python3 tests/nccl/torch_bench.py --label trace --out $OUT/trace.json --ops send_recv --min-bytes 64MiB --max-bytes 64MiB > $OUT/trace.log 2>&1 || echo "trace failed"
echo "in place: $(grep -c 'landed in place' $OUT/trace.log), copied: $(grep -c 'copied into buffer' $OUT/trace.log)"; gzip -f $OUT/trace.log
cd $OUT && tar czf logs.tgz tuned default && rm -rf tuned default
