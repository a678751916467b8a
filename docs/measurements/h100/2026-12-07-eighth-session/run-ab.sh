#!/usr/bin/env bash
# Seventh session: has the plugin got slower at NCCL's defaults? send/recv 64 MiB-1 GiB under
# PyTorch's NCCL, plugin builds of edf1624 (crc-fast, 2.4 x Socket on 2026-12-06),
# 50b7fe0 (the sixth session's start), head (main now) and NCCL's Socket, one round.
set -u
A=$PWD/target/dev/ab
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
{ nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader; lscpu | grep "Model name"; nproc; } > $OUT/gpu.txt; cat $OUT/gpu.txt
ROUNDS=1 OUT=$OUT/default MIN_BYTES=64MiB RUN_TIMEOUT=80 timeout 330 bash tests/nccl/ab.sh \
  edf1624 "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/edf1624.so" \
  s50b7fe0 "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/50b7fe0.so" \
  head "NCCL_NET=grdma NCCL_NET_PLUGIN=$A/head.so" socket "NCCL_NET=Socket" 2>&1 | tee $OUT/default.txt
cd $OUT && tar czf default.tgz default && rm -rf default
