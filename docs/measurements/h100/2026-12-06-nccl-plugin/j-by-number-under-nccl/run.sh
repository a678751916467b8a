#!/usr/bin/env bash
# A/B on the device: eager messages placed by number (NCCL_GRDMA_EAGER_BY_NUMBER=1) against
# main's match frames, beside NCCL's Socket, NCCL's defaults. Alternated, same machine.
set -u
P=$PWD/target/plugin/libnccl-net-grdma.so
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt
ldd $P | grep -E "ibverbs|rdmacm|not found" >> $OUT/gpu.txt
t0=$(date +%s)
# round 1: every op, 1 KiB .. 1 GiB
OUT=$OUT/r1 RUNS="socket-default grdma-default grdma-default-by-number" PLUGIN=$P timeout 300 bash tests/nccl/h200-run.sh > $OUT/r1.txt 2>&1
echo "r1 $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
# round 2, 3: send/recv only, alternated in the other order
for r in 2 3; do
  [ $(( $(date +%s) - t0 )) -lt 420 ] || break
  OUT=$OUT/r$r RUNS="grdma-default-by-number grdma-default socket-default" PLUGIN=$P BENCH_ARGS="--ops send_recv" timeout 150 bash tests/nccl/h200-run.sh > $OUT/r$r.txt 2>&1
  echo "r$r $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
done
cd $OUT && tar czf ab.tgz r1 r2 r3 2>/dev/null; rm -rf $OUT/r1 $OUT/r2 $OUT/r3
cat $OUT/times.txt; grep -h "largest size\|FAILED\|never says" $OUT/r*.txt
