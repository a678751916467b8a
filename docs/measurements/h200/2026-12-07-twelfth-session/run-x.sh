#!/usr/bin/env bash
# Twelfth session: on an H200, the issues' runs (run-w.sh: t1 + t2). On another card: the
# plugin's data sockets per connection at NCCL's defaults, send/recv 64 MiB-1 GiB,
# 2 / 4 / 8 (the loopback default) against NCCL's Socket, 3 rounds alternated (ab.sh).
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) exec bash target/dev/run-w.sh;;
esac
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/card.txt
echo "plugin of $(cat target/dev/plugin/commit.txt)"
P=$PWD/target/dev/plugin/libnccl-net-grdma.so
ROUNDS=3 OPS=send_recv MIN_BYTES=64MiB MAX_BYTES=1GiB RUN_TIMEOUT=120 OUT=$OUT/ab timeout 560 bash tests/nccl/ab.sh \
  s2 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma NCCL_GRDMA_STREAMS=2" \
  s4 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma NCCL_GRDMA_STREAMS=4" \
  s8 "NCCL_NET_PLUGIN=$P NCCL_NET=grdma" \
  socket "NCCL_NET=Socket" 2>&1 | tee $OUT/ab-printed.txt | grep -E "^(s2|s4|s8|socket|ab:)"
grep -h "streams\|sockets" $OUT/ab/s8-1.log.gz 2>/dev/null | head -0
zcat $OUT/ab/s8-1.log.gz | grep -m2 -i "listen" ; zcat $OUT/ab/s2-1.log.gz | grep -m2 -i "listen"
cd $OUT && tar czf ab.tgz ab && rm -rf ab
