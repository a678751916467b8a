# checksums.sh - protocol version 2 over verbs (issue 17): CRC32C of every chunk, sent
# after the data and checked where the chunks landed; chunks that fail are sent again
# (within --max-resends); the ack's digest; storing what was received (--output).
# Run by tests/tests/softroce.rs (topology one); output format: lib.sh.
#
# Until the command line has --verify, --max-resends, --test-inject-faults and --output,
# the settings reach the verbs transport through its test hook's environment variables
# (host/src/transport/rdma/test_hook.rs): GRDM_TEST_VERIFY, GRDM_TEST_MAX_RESENDS,
# GRDM_TEST_INJECT_FAULTS, GRDM_TEST_PAYLOAD, GRDM_TEST_OUTPUT.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR

receiver() {
  start receiver "$@" host recv --gpu none --transport rdma --timeout 10 --json
  wait_for receiver "receiver: listening" 30
}

# 17a. --verify checksum and both, send and write: verified, with the digest.
case_verify() {
  local op v n=0
  receiver
  for op in send write; do
    for v in checksum both; do
      run "${op}_$v" 60 env GRDM_TEST_VERIFY=$v \
        host "$A" 7471 --gpu none --transport rdma --size 4MiB --chunk 64KiB --op $op --timeout 10 --json
      n=$((n + 1))
    done
  done
  wait_outcomes receiver $n 30
  stop receiver
}

# 17b. Faults injected after the checksums: one chunk in 100 (64 MiB in 1024 chunks of
#      64 KiB, send and write) and one in 10000 (64 MiB in 16384 chunks of 4 KiB) are
#      repaired by resends; the ack counts them.
case_repair() {
  receiver
  run send_100 120 env GRDM_TEST_VERIFY=checksum GRDM_TEST_INJECT_FAULTS=1/100 \
    host "$A" 7471 --gpu none --transport rdma --size 64MiB --chunk 64KiB --op send --timeout 10 --json
  run write_100 120 env GRDM_TEST_VERIFY=both GRDM_TEST_INJECT_FAULTS=1/100 \
    host "$A" 7471 --gpu none --transport rdma --size 64MiB --chunk 64KiB --op write --timeout 10 --json
  run write_10000 180 env GRDM_TEST_VERIFY=checksum GRDM_TEST_INJECT_FAULTS=1/10000 \
    host "$A" 7471 --gpu none --transport rdma --size 64MiB --chunk 4KiB --op write --timeout 10 --json
  run reused 120 env GRDM_TEST_VERIFY=checksum GRDM_TEST_INJECT_FAULTS=1/100 \
    host "$A" 7471 --gpu none --transport rdma --size 8MiB --chunk 64KiB --op send \
    --iters 5 --reuse-connection --timeout 10 --json
  wait_outcomes receiver 4 30
  stop receiver
}

# 17c. Every chunk corrupted, every time (1/1): the resends are used up, the sender's error
#      names the chunks, and the receiver serves the next sender.
case_give_up() {
  receiver
  run send_all 60 env GRDM_TEST_VERIFY=checksum GRDM_TEST_INJECT_FAULTS=1/1 \
    host "$A" 7471 --gpu none --transport rdma --size 1MiB --chunk 64KiB --op send --timeout 10
  run write_one_round 60 env GRDM_TEST_VERIFY=checksum GRDM_TEST_INJECT_FAULTS=1/1 GRDM_TEST_MAX_RESENDS=1 \
    host "$A" 7471 --gpu none --transport rdma --size 1MiB --chunk 4KiB --op write --timeout 10
  run after 60 env GRDM_TEST_VERIFY=checksum \
    host "$A" 7471 --gpu none --transport rdma --size 1MiB --op write --timeout 10 --json
  wait_outcomes receiver 3 30
  stop receiver
}

# 17d. The receiver stores each verified transfer (--output DIR: a file per transfer);
#      a write that fails (the directory gone) is acked "not stored", and the receiver
#      serves on.
case_store() {
  mkdir -p /tmp/out
  receiver env GRDM_TEST_OUTPUT=/tmp/out
  run first 60 env GRDM_TEST_PAYLOAD=opaque \
    host "$A" 7471 --gpu none --transport rdma --size 4MiB --chunk 64KiB --op write --timeout 10 --json
  wait_outcomes receiver 1 30
  val stored_files "$(ls /tmp/out | wc -l)"
  val stored_bytes "$(cat /tmp/out/* | wc -c)"
  rm -rf /tmp/out
  run unstored 60 env GRDM_TEST_PAYLOAD=opaque \
    host "$A" 7471 --gpu none --transport rdma --size 4MiB --chunk 64KiB --op send --timeout 10 --json
  mkdir -p /tmp/out
  run again 60 env GRDM_TEST_PAYLOAD=opaque \
    host "$A" 7471 --gpu none --transport rdma --size 1MiB --op send --timeout 10 --json
  wait_outcomes receiver 3 30
  val stored_again "$(ls /tmp/out | wc -l)"
  stop receiver
}

ALL="verify repair give_up store"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
