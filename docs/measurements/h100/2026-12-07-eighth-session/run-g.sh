#!/usr/bin/env bash
# Seventh session: send/recv at 256 MiB at NCCL's defaults, the plugin (main) at NCCL_GRDMA_STREAMS=1,2,4,8
# against NCCL's Socket at NCCL_SOCKET_NTHREADS=1,2,4,8 (tests/nccl/h200-run.sh RUNS=streams-sweep), twice.
set -u
export NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader; lscpu | grep "Model name"; nproc; } > $OUT/gpu.txt; cat $OUT/gpu.txt
for round in 1 2; do
RUNS=streams-sweep PLUGIN=$PWD/target/dev/ab/head.so OUT=$OUT/sweep-$round timeout 280 bash tests/nccl/h200-run.sh > $OUT/sweep-$round.log 2>&1; echo "sweep $round rc=$?"
grep -E "send_recv" $OUT/sweep-$round.log | grep -v "==>" | head -20
done
cd $OUT && tar czf sweep.tgz sweep-1 sweep-2 && rm -rf sweep-1 sweep-2
