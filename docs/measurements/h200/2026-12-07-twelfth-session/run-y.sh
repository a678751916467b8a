#!/usr/bin/env bash
# Twelfth session, call 3 (same H200 as call 2): run-t3.sh (GPU to GPU against host to
# host over TCP at 1/4/8 streams; host bench tcp), then the plugin's streams at NCCL's
# defaults (2/4/8 against Socket, send/recv 64 MiB-1 GiB, 2 rounds) in the time left.
set -u
start=$SECONDS
mkdir -p $OUT/t3
OUT=$OUT/t3 bash target/dev/run-t3.sh 2>&1 | tee $OUT/t3-printed.txt
echo "t3 took $((SECONDS-start)) s"
P=$PWD/target/dev/plugin/libnccl-net-grdma.so
left=$((585-(SECONDS-start)))
ROUNDS=2 OPS=send_recv MIN_BYTES=64MiB MAX_BYTES=1GiB RUN_TIMEOUT=90 OUT=$OUT/ab timeout $left bash tests/nccl/ab.sh \
  s2 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma NCCL_GRDMA_STREAMS=2" \
  s4 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma NCCL_GRDMA_STREAMS=4" \
  s8 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma" \
  socket "NCCL_NET=Socket" 2>&1 | tee $OUT/ab-printed.txt | grep -E "^(s2|s4|s8|socket|ab:)"
echo "all took $((SECONDS-start)) s"
cd $OUT && tar czf t3ab.tgz t3 ab && rm -rf t3 ab
