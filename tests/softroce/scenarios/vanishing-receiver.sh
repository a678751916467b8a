# vanishing-receiver.sh - the receiver's host vanishes mid-transfer (topology two).
# Guest b runs a receiver; guest a sends it 16 MiB, slowly: 512-byte chunks, one in
# flight, about 40 s (0.4 MB/s) on an idle 2-core machine after a setup of a fraction of
# a second. So the transfer is under way when run-guest.sh kills b's QEMU 8 s after b's
# start, on machines several times faster or slower:
#
#   tests/softroce/run-guest.sh --topology two --kill-b-after 8 \
#       --bin target/guest/release/host --bin tests/softroce/scenarios/lib.sh \
#       -- tests/softroce/scenarios/vanishing-receiver.sh
#
# a's sender must then fail by itself with a clear error within its --timeout (20 s):
# the connection's retry_count (6) makes rxe give up instead of retrying forever. Should
# a transfer finish before the kill, a sends again (at most 5 times). The test measures,
# on the host, the time from the kill to a's `@@OUT` line of the failed sender.
. /opt/bin/lib.sh || exit 2

case_begin receiver_vanishes
if [ "$ROLE" = b ]; then
  start receiver host recv --gpu none --timeout 60
  finish receiver 300          # killed long before
else
  i=0
  while [ $i -lt 5 ]; do
    i=$((i + 1))
    send_retry "sender$i" 120 host "$PEER_ADDR" 7471 --gpu none --size 16MiB --chunk 512 --depth 1 --timeout 20
    [ "$(eval "echo \$R_sender$i")" = 0 ] || break
  done
fi
case_end
exit 0
