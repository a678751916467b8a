# two-guests.sh - the transfer scenarios in topology two: guest b runs the receivers,
# guest a the senders, to PEER_ADDR. Run by tests/tests/softroce.rs:
#
#   tests/softroce/run-guest.sh --topology two --bin target/guest/release/host \
#       --bin tests/softroce/scenarios/lib.sh -- tests/softroce/scenarios/two-guests.sh
#
# Both guests run the cases in the same order, each printing its own sections (the
# receivers' in [b], the senders' in [a]). a cannot see when b listens, so its senders
# retry while they are refused (bounded). Every case has a port of its own, so that a
# sender can never reach the receiver of another case. Output format: lib.sh.
. /opt/bin/lib.sh || exit 2
P=$PEER_ADDR

# 1. The seed scenario (port 7471, the default).
case_seed() {
  if [ "$ROLE" = b ]; then
    start receiver host recv --once
    finish receiver 120
  else
    send_retry sender 90 host "$P" 7471 --gpu none
  fi
}

# 2. RDMA WRITE_WITH_IMM: 16 KiB, then 4 MiB in 16 chunks.
case_write() {
  if [ "$ROLE" = b ]; then
    start receiver host recv --port 7472 --gpu none --timeout 30
    wait_outcomes receiver 2 120
    stop receiver
  else
    send_retry sender 90 host "$P" 7472 --gpu none --op write
    send_retry sender_chunks 90 host "$P" 7472 --gpu none --op write --size 4MiB --chunk 256KiB --timeout 30
  fi
}

# 3. A chunked transfer: 64 MiB in 1 MiB chunks.
case_chunked() {
  if [ "$ROLE" = b ]; then
    start receiver host recv --once --port 7473 --gpu none --timeout 30
    finish receiver 240
  else
    send_retry sender 180 host "$P" 7473 --gpu none --size 64MiB --timeout 30
  fi
}

# 4. Nobody listens on port 7479 of b.
case_no_receiver() {
  if [ "$ROLE" = a ]; then
    run sender 30 host "$P" 7479 --gpu none
  fi
}

# 5. Three senders at once (after a first one that waits for b to listen).
case_concurrent() {
  if [ "$ROLE" = b ]; then
    start receiver host recv --port 7474 --gpu none --timeout 30
    wait_outcomes receiver 4 240
    stop receiver
  else
    send_retry first_sender 90 host "$P" 7474 --gpu none
    start sender1 host "$P" 7474 --gpu none --size 8MiB --timeout 60
    start sender2 host "$P" 7474 --gpu none --size 8MiB --op write --timeout 60
    start sender3 host "$P" 7474 --gpu none --size 8MiB --chunk 64KiB --timeout 60
    finish sender1 180
    finish sender2 180
    finish sender3 180
  fi
}

ALL="seed write chunked no_receiver concurrent"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
