#!/usr/bin/env bash
# Eleventh session, call 5: the plugin with small messages staged before they reach NCCL's
# buffer ("after") against the plugin of bf876f9 ("before") and NCCL's Socket, under PyTorch.
# 1) faults at 1 in 100 pieces, every op, 1 KiB..1 MiB (where NCCL uses LL / LL128), 2 rounds:
#    must be bit-exact; 2) NCCL's defaults, send/recv 64 MiB..1 GiB, 2 rounds; 3) tuned (2 MiB
#    chunks, 16 MiB buffers, 4 streams / 4 Socket threads), 2 rounds; 4) defaults, small sizes.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
P=$PWD/target/dev/plugin; B="NCCL_NET_PLUGIN=$P/before.so NCCL_NET=grdma"; A="NCCL_NET_PLUGIN=$P/libnccl-net-grdma.so NCCL_NET=grdma"
T="NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
F=NCCL_GRDMA_TEST_INJECT_FAULTS=100
ROUNDS=2 OPS=send_recv,all_reduce,all_gather,broadcast MIN_BYTES=1KiB MAX_BYTES=1MiB OUT=$OUT/faults RUN_TIMEOUT=100 timeout 200 bash tests/nccl/ab.sh before "$B $F" after "$A $F" 2>&1 | tail -8; echo "faults rc=${PIPESTATUS[0]}"
for f in $OUT/faults/*.log.gz; do echo "$(basename $f): $(zcat $f | grep -c MISMATCH) mismatches, $(zcat $f | grep -o 'finalized: sent [0-9]* messages.*' | grep -o '[0-9]* pieces sent again' | head -1)"; done
ROUNDS=2 MIN_BYTES=64MiB MAX_BYTES=1GiB OUT=$OUT/default RUN_TIMEOUT=100 timeout 170 bash tests/nccl/ab.sh socket "NCCL_NET=Socket" before "$B" after "$A" 2>&1 | tail -8
ROUNDS=2 MIN_BYTES=64MiB MAX_BYTES=1GiB OUT=$OUT/tuned RUN_TIMEOUT=100 timeout 150 bash tests/nccl/ab.sh socket "NCCL_NET=Socket $T NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4" before "$B $T NCCL_GRDMA_STREAMS=4" after "$A $T NCCL_GRDMA_STREAMS=4" 2>&1 | tail -8
ROUNDS=1 OPS=send_recv,all_reduce MIN_BYTES=1KiB MAX_BYTES=1MiB OUT=$OUT/small RUN_TIMEOUT=100 timeout 80 bash tests/nccl/ab.sh socket "NCCL_NET=Socket" before "$B" after "$A" 2>&1 | tail -8
cd $OUT && tar czf ab.tgz faults default tuned small && rm -rf faults default tuned small; ls
