#!/usr/bin/env bash
# Where a 128 KiB step's time goes at NCCL's defaults: the trace of 16 MiB send/recvs.
set -u
P=$PWD/target/plugin/libnccl-net-grdma.so
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
b() { local label=$1; shift; env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" timeout 120 python3 tests/nccl/torch_bench.py --label $label --out $OUT/$label.json --ops send_recv --min-bytes 16MiB --max-bytes 16MiB > $OUT/$label.log 2>&1 || echo "$label failed"; }
G=(NCCL_NET_PLUGIN=$P NCCL_NET=grdma NCCL_GRDMA_TRACE=1)
b trace-match "${G[@]}"
b trace-number "${G[@]}" NCCL_GRDMA_EAGER_BY_NUMBER=1
b trace-checks-off "${G[@]}" NCCL_GRDMA_CHECKS=0
grep -h GBps $OUT/*.log | head; cd $OUT && tar czf traces.tgz *.log *.json && rm -f *.log *.json
