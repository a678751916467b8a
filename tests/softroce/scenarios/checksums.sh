# checksums.sh - protocol version 2 over verbs (issue 17): CRC32C of every chunk, sent
# after the data and checked where the chunks landed; chunks that fail are sent again
# (within --max-resends); the ack's digest; storing what was received (--output).
# Run by tests/tests/softroce.rs (topology one); output format: lib.sh.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR

receiver() {
  start receiver host recv --gpu none --transport rdma --timeout 10 --json "$@"
  wait_for receiver "receiver: listening" 30
}

# 17a. --verify checksum and both, send and write: verified, with the digest.
case_verify() {
  local op v n=0
  receiver
  for op in send write; do
    for v in checksum both; do
      run "${op}_$v" 60 \
        host "$A" 7471 --verify $v --gpu none --transport rdma --size 4MiB --chunk 64KiB --op $op --timeout 10 --json
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
  run send_100 120 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/100 --gpu none --transport rdma --size 64MiB --chunk 64KiB --op send --timeout 10 --json
  run write_100 120 \
    host "$A" 7471 --verify both --test-inject-faults 1/100 --gpu none --transport rdma --size 64MiB --chunk 64KiB --op write --timeout 10 --json
  run write_10000 180 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/10000 --gpu none --transport rdma --size 64MiB --chunk 4KiB --op write --timeout 10 --json
  run reused 120 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/100 --gpu none --transport rdma --size 8MiB --chunk 64KiB --op send \
    --iters 5 --reuse-connection --timeout 10 --json
  wait_outcomes receiver 4 30
  stop receiver
}

# 17e. One chunk in three corrupted on every sending (1/3, issue 25 item 5): the rounds go
#      on while they repair (up to --max-resends, 16 by default), and the transfer
#      arrives whole over SEND and WRITE.
case_converge() {
  receiver
  run send_3 120 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/3 --gpu none --transport rdma --size 16MiB --chunk 64KiB --op send --timeout 10 --json
  run write_3 120 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/3 --gpu none --transport rdma --size 16MiB --chunk 64KiB --op write --timeout 10 --json
  wait_outcomes receiver 2 30
  stop receiver
}

# 17c. Every chunk corrupted, every time (1/1): the resends are used up, the sender's error
#      names the chunks, and the receiver serves the next sender.
case_give_up() {
  receiver
  run send_all 60 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/1 --gpu none --transport rdma --size 1MiB --chunk 64KiB --op send --timeout 10
  run write_one_round 60 \
    host "$A" 7471 --verify checksum --test-inject-faults 1/1 --max-resends 1 --gpu none --transport rdma --size 1MiB --chunk 4KiB --op write --timeout 10
  run after 60 \
    host "$A" 7471 --verify checksum --gpu none --transport rdma --size 1MiB --op write --timeout 10 --json
  wait_outcomes receiver 3 30
  stop receiver
}

# 17d. The receiver stores each verified transfer (--output DIR: a file per transfer);
#      a write that fails (the directory gone) is acked "not stored", and the receiver
#      serves on.
case_store() {
  mkdir -p /tmp/out
  head -c 4194304 /dev/urandom > /tmp/in.bin
  receiver --output /tmp/out
  run first 60 host "$A" 7471 --gpu none --transport rdma --input /tmp/in.bin --chunk 64KiB --op write --timeout 10 --json
  wait_outcomes receiver 1 30
  val stored_files "$(ls /tmp/out | wc -l)"
  val stored_same "$([ "$(sha256sum < /tmp/in.bin)" = "$(cat /tmp/out/* | sha256sum)" ] && echo 1 || echo 0)"
  rm -rf /tmp/out
  run unstored 60 host "$A" 7471 --gpu none --transport rdma --input /tmp/in.bin --chunk 64KiB --op send --timeout 10 --json
  mkdir -p /tmp/out
  run again 60 host "$A" 7471 --gpu none --transport rdma --input /tmp/in.bin --op send --timeout 10 --json
  wait_outcomes receiver 3 30
  val stored_again "$(ls /tmp/out | wc -l)"
  stop receiver
  rm -rf /tmp/out /tmp/in.bin
}

ALL="verify repair converge give_up store"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
