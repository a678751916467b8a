#!/usr/bin/env bash
# crc-fast against the crc32c crate in the NCCL plugin: the plugin alone (bench_loopback,
# no NCCL, no GPU) at 1/4/8 streams, then send/recv under PyTorch tuned and at the
# defaults, main / crcfast / Socket alternated.
set -u
A=$PWD/target/ab
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
{ nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader; lscpu | grep "Model name"; grep -o -w "vpclmulqdq\|avx512f\|sse4_2" /proc/cpuinfo | sort | uniq -c; } > $OUT/gpu.txt
for n in 1 4 8; do for b in main crcfast; do
  NCCL_GRDMA_PLUGIN=$A/$b.so NCCL_GRDMA_STREAMS=$n timeout 60 $A/harness --ignored --exact bench_loopback --nocapture 2>&1 | grep GBps | sed "s/^/$b streams=$n /" | tee -a $OUT/plugin-bench.txt
done; done
T="NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
G="NCCL_NET=grdma NCCL_GRDMA_STREAMS=4"
ROUNDS=2 OUT=$OUT/tuned MIN_BYTES=16MiB RUN_TIMEOUT=100 timeout 300 bash tests/nccl/ab.sh \
  main "$T $G NCCL_NET_PLUGIN=$A/main.so" crcfast "$T $G NCCL_NET_PLUGIN=$A/crcfast.so" \
  socket "$T NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=1 NCCL_SOCKET_NTHREADS=4" 2>&1 | tee $OUT/tuned.txt
ROUNDS=1 OUT=$OUT/default MIN_BYTES=64MiB RUN_TIMEOUT=100 timeout 150 bash tests/nccl/ab.sh \
  main "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/main.so" crcfast "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/crcfast.so" \
  socket "NCCL_NET=Socket" 2>&1 | tee $OUT/default.txt
zgrep -h "CRC32C by" $OUT/*/crcfast-1.log.gz | head -2
# Where a tuned 2 MiB step's time goes: 64 MiB send/recv tuned, crcfast, traced.
env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET $T $G NCCL_NET_PLUGIN=$A/crcfast.so NCCL_GRDMA_TRACE=1 timeout 100 \
  python3 tests/nccl/torch_bench.py --label trace-tuned --out $OUT/trace-tuned.json --ops send_recv --min-bytes 64MiB --max-bytes 64MiB > $OUT/trace-tuned.log 2>&1 || echo "trace-tuned failed"
python3 $A/steps.py $OUT/trace-tuned.log > $OUT/trace-tuned-steps.txt 2>&1; head -20 $OUT/trace-tuned-steps.txt; gzip -f $OUT/trace-tuned.log
