# one-guest.sh - the transfer scenarios in topology one (one guest; sender and receiver
# both on RXE_ADDR, rxe loops the packets). Run by tests/tests/softroce.rs:
#
#   tests/softroce/run-guest.sh --bin target/guest/release/host \
#       --bin tests/softroce/scenarios/lib.sh -- tests/softroce/scenarios/one-guest.sh [CASE...]
#
# With CASE names, only those cases run (for working on one). Output format: lib.sh.
# The script itself exits 0 once every case has run; the test asserts on each section.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR

# 1. The seed scenario, exactly as in the issue: 16 KiB, one SEND_WITH_IMM.
case_seed() {
  start receiver host recv --once
  wait_for receiver "receiver: listening" 30
  run sender 60 host "$A" 7471 --gpu none
  finish receiver 30
}

# 2. RDMA WRITE_WITH_IMM into the buffer the receiver advertises: the seed's 16 KiB,
#    then 4 MiB in 16 chunks (the immediates carry the progress).
case_write() {
  start receiver host recv --gpu none --timeout 30
  wait_for receiver "receiver: listening" 30
  run sender 60 host "$A" 7471 --gpu none --op write
  run sender_chunks 60 host "$A" 7471 --gpu none --op write --size 4MiB --chunk 256KiB --timeout 30
  wait_outcomes receiver 2 30
  stop receiver
}

# 3. A chunked transfer: 256 MiB in 1 MiB chunks.
case_chunked() {
  start receiver host recv --once --gpu none --timeout 30
  wait_for receiver "receiver: listening" 30
  run sender 180 host "$A" 7471 --gpu none --size 256MiB --timeout 30
  finish receiver 60
}

# 4a. --raw against rdma-core's rdma_server (16-byte message, 16-byte reply). Its
#     output is block-buffered (a file), so the sender retries until it listens.
case_raw_rdma_server() {
  start server rdma_server -s "$A"
  send_retry sender 30 host "$A" 7471 --raw --size 16 --gpu none
  finish server 30
}

# 4b. rdma-core's rdma_client (16 zero bytes) against `host recv --raw --once`.
case_raw_rdma_client() {
  start receiver host recv --raw --once --gpu none
  wait_for receiver "receiver: listening" 30
  run client 30 rdma_client -s "$A"
  finish receiver 30
}

# 4c. host --raw against host recv --raw: the seed's wire behaviour on both sides.
case_raw_host() {
  start receiver host recv --raw --once --gpu none
  wait_for receiver "receiver: listening" 30
  run sender 30 host "$A" 7471 --raw --gpu none
  finish receiver 30
}

# 5a. Nobody listens.
case_no_receiver() {
  run sender 30 host "$A" 7471 --gpu none
}

# 5b. The sender is killed (SIGKILL) mid-transfer; the receiver (not --once) reports
#     the incomplete transfer and serves the next sender.
case_sender_killed() {
  local base
  start receiver host recv --gpu none --timeout 10
  wait_for receiver "receiver: listening" 30
  base=$(recvs)
  start sender host "$A" 7471 --gpu none --size 256MiB --timeout 30
  # Kill it once 16 of its 256 chunks have landed (a second or two after its start).
  wait_data "$base" 16 120
  val chunks_before_kill "$(($(recvs) - base))"
  mark killed_at
  kill_now sender KILL
  finish sender 10
  wait_for receiver "incomplete transfer" 60
  run next_sender 60 host "$A" 7471 --gpu none --timeout 30
  wait_outcomes receiver 2 30
  stop receiver
}

# 5c. The receiver process is killed (SIGKILL) mid-transfer: the sender must fail
#     within its --timeout (20 s).
case_receiver_killed() {
  local base
  start receiver host recv --gpu none --timeout 10
  wait_for receiver "receiver: listening" 30
  base=$(recvs)
  start sender host "$A" 7471 --gpu none --size 256MiB --timeout 20
  wait_data "$base" 16 120
  val chunks_before_kill "$(($(recvs) - base))"
  mark killed_at
  kill_now receiver KILL
  finish receiver 10
  finish sender 60
}

# 5d. Offers the receiver must refuse, each with its reason, serving on: a header-less
#     (--raw) sender, a header of protocol version 3 (this one speaks 2), and 2 MiB against --max-bytes 1MiB;
#     then a good transfer.
case_rejections() {
  start receiver host recv --gpu none --max-bytes 1MiB --timeout 30
  wait_for receiver "receiver: listening" 30
  run raw_sender 30 host "$A" 7471 --raw --gpu none
  run version_sender 30 host "$A" 7471 --gpu none --protocol-version 4
  run large_sender 30 host "$A" 7471 --gpu none --size 2MiB
  run good_sender 30 host "$A" 7471 --gpu none
  wait_outcomes receiver 4 30
  stop receiver
}

# 5e. A second receiver on a port that is taken; the first one serves on.
case_port_in_use() {
  start receiver host recv --gpu none
  wait_for receiver "receiver: listening" 30
  run second_receiver 30 host recv --gpu none
  run sender 30 host "$A" 7471 --gpu none
  wait_outcomes receiver 1 30
  stop receiver
}

# 6. Three senders at once to one receiver (served in turn): SEND, WRITE, small chunks.
case_concurrent() {
  start receiver host recv --gpu none --timeout 30
  wait_for receiver "receiver: listening" 30
  start sender1 host "$A" 7471 --gpu none --size 8MiB --timeout 60
  start sender2 host "$A" 7471 --gpu none --size 8MiB --op write --timeout 60
  start sender3 host "$A" 7471 --gpu none --size 8MiB --chunk 64KiB --timeout 60
  finish sender1 120
  finish sender2 120
  finish sender3 120
  wait_outcomes receiver 3 30
  stop receiver
}

# 7. The CUDA build (`host-cuda`, with NVIDIA's real driver library but no GPU in the
#    guest): --mem auto must fall back to host memory and say why; --mem device refuses.
case_cuda_build_no_gpu() {
  if ! command -v host-cuda >/dev/null; then
    echo "@@VAL skipped=1@@"
    return
  fi
  start receiver host recv --gpu none --timeout 30
  wait_for receiver "receiver: listening" 30
  run auto_sender 60 host-cuda "$A" 7471
  run device_sender 60 host-cuda "$A" 7471 --mem device
  wait_outcomes receiver 1 30
  stop receiver
}

# 8. GPUDirect facts, asked of the NIC: `host info` probes dma-buf registration on rxe0
#    the way NCCL does (ibv_reg_dmabuf_mr with fd -1) and must find it not supported,
#    and place rxe0 as a software device; `host doctor` says GPUDirect will not work, and
#    why, and still finds a path (exit 0). That host memory on the same device carries a
#    transfer is case 1 (seed), which the test checks alongside.
case_gpudirect_probe() {
  run info 30 host info
  run doctor 30 host doctor
}

# 9. The tutorial's verbs example (examples/host/rdma_loopback.rs), where the test copied
#    it in: a listener and a client in one process on rxe0, one SEND of a registered
#    16 KiB buffer, the receive verified; then an address no RDMA device has (one error).
case_loopback_example() {
  if ! command -v rdma-loopback >/dev/null; then
    echo "@@VAL skipped=1@@"
    return
  fi
  run example 60 rdma-loopback "$A" 7473
  run wrong_address 30 rdma-loopback 198.51.100.7 7473
}

# 9b. The library's endpoint example (examples/host/endpoint.rs), where the test copied it
#     in: 100 transfers of different sizes over one endpoint to a listener on rxe0's
#     address, the library choosing verbs there, each received in place and checked; the
#     last one started and polled. Then 20 more by RDMA WRITE into the caller's buffers
#     (each checked again once the sender's NIC can no longer write it).
case_library_endpoint() {
  if ! command -v endpoint >/dev/null; then
    echo "@@VAL skipped=1@@"
    return
  fi
  run endpoint 240 endpoint 100 "$A:0"
  run endpoint_write 120 endpoint 20 "$A:0" write
}

# 10. Rails (docs/hardware.md#rails): the seed transfer through --nic rxe0 (the one
#     rail), then --rails 1; a name that is no device and more rails than there are are
#     refused, each in one line naming what there is.
case_rails() {
  start receiver host recv --gpu none --timeout 30
  wait_for receiver "receiver: listening" 30
  run nic 60 host "$A" 7471 --gpu none --nic rxe0
  run rails_one 60 host "$A" 7471 --gpu none --rails 1
  wait_outcomes receiver 2 30
  stop receiver
  run unknown 30 host "$A" 7471 --gpu none --nic rxe9
  run too_many 30 host "$A" 7471 --gpu none --rails 2
}

ALL="seed write chunked raw_rdma_server raw_rdma_client raw_host no_receiver sender_killed receiver_killed rejections port_in_use concurrent cuda_build_no_gpu gpudirect_probe loopback_example library_endpoint rails"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
