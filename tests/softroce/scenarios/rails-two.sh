# rails-two.sh - verbs rails between two guests, each rail a link of its own (issue 19).
# Topology two with two NICs per guest (run-guest.sh --topology two --nics 2): rail 0 is
# rxe0 on eth0 (192.0.2.x, guest-init.sh's), rail 1 is rxe1 on eth1 (198.51.100.x, set up
# here). Unlike rails.sh's one guest, where rxe loops both ends of a rail inside one
# device, taking a's eth1 down leaves b's rxe1 up, and bringing it back is a link coming
# back: what a NIC's cable does. Guest b runs the receivers, guest a the senders; both
# run the cases in the same order, each case on a port of its own. Run by
# tests/tests/softroce.rs; output format: lib.sh.
#
# failover (with back_up after it), far_end_down and control_rail_down each leave a
# device Soft-RoCE cannot use again: an rxe whose link went down under traffic receives
# nothing afterwards, and making it anew (rdma link delete/add) on a virtio NIC once
# panicked a guest's kernel in rxe_skb_tx_dtor (a CI run), where rails.sh's veth never
# did. So the tests boot the guests once per group: striped down_then_up far_end_down
# (the default), failover back_up, and control_rail_down.
. /opt/bin/lib.sh || exit 2
IP=/usr/bin/ip
RDMA=/usr/bin/rdma
if [ "$ROLE" = a ]; then MINE=198.51.100.1 THEIRS=198.51.100.2; else MINE=198.51.100.2 THEIRS=198.51.100.1; fi
# The receiver's two addresses, as a sender names them (rail k to the k-th).
RAILS="$PEER_ADDR,$THEIRS"

# until_true SECS CMD...: until CMD succeeds, every 0.1 s; 1 after SECS.
until_true() {
  local bound=$(($1 * 100)) t0
  shift
  t0=$(now_cs)
  until "$@"; do
    [ $(($(now_cs) - t0)) -ge "$bound" ] && return 1
    sleep 0.1
  done
}

active() { grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state; }
# rxe1's RoCE v2 GID for MINE (::ffff:c633:64xx), which the kernel re-adds after eth1 is up.
has_gid() {
  local tail
  tail=$(printf 'c633:64%02x' "${MINE##*.}")
  cat /sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null | grep -q ":ffff:$tail\$"
}
reaches_peer() { ping -c 1 -W 1 "$THEIRS" >/dev/null 2>&1; }

# The second rail, as guest-init.sh makes the first: eth1 up at eth0's MTU, rxe1 on it,
# the address, its GID; then the peer's second address answers.
second_rail() {
  until_true 5 test -e /sys/class/net/eth1 || return 1
  $IP link set eth1 mtu "$(cat /sys/class/net/eth0/mtu)" || return 1
  $IP link set eth1 up || return 1
  $RDMA link add rxe1 type rxe netdev eth1 || return 1
  until_true 10 active || return 1
  $IP addr add "$MINE/24" dev eth1 || return 1
  until_true 10 has_gid || return 1
  until_true 60 reaches_peer
}

# Packet counters: rxe0's and rxe1's sent (a rail's chunks, at the sender), rxe1's received.
sent0() { local n; read -r n < /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts; echo "$n"; }
sent1() { local n; read -r n < /sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts; echo "$n"; }
rcvd1() { local n; read -r n < /sys/class/infiniband/rxe1/ports/1/hw_counters/rcvd_pkts; echo "$n"; }

receiver() { # PORT
  start receiver host recv --port "$1" --gpu none --transport rdma --timeout 10 --json
}

striped() { # LABEL PORT ARGS...
  local label=$1 port=$2
  shift 2
  send_retry "$label" 180 host "$RAILS" "$port" --nic rxe0,rxe1 --op write --gpu none \
    --transport rdma --timeout 10 --json "$@"
}

# Both rails carry chunks of one 256 MiB transfer.
case_striped() {
  if [ "$ROLE" = b ]; then
    receiver 7481
    wait_outcomes receiver 1 240
    stop receiver
  else
    striped sender 7481 --size 256MiB
  fi
}

# a's eth1 goes down in the middle of a 256 MiB transfer: a's rxe1 port goes DOWN, rail 1
# fails, its chunks in flight go to rail 0, and the transfer verifies at b. The same
# process then makes a second transfer (--iters 2), with rail 1 resting or down: rail 0
# carries it alone, unstriped, saying why.
case_failover() {
  if [ "$ROLE" = b ]; then
    receiver 7482
    wait_outcomes receiver 3 240
    stop receiver
  else
    local base
    # b listens once this small one-rail transfer got through.
    send_retry ready 90 host "$PEER_ADDR" 7482 --gpu none --transport rdma --size 1MiB --timeout 10
    base=$(sent1)
    start sender host "$RAILS" 7482 --nic rxe0,rxe1 --op write --gpu none --transport rdma \
      --timeout 10 --json --size 256MiB --chunk 256KiB --iters 2
    # 4096 packets: about 16 MiB on rail 1 (rxe's 4 KiB path MTU), so it carried a share.
    until [ $(($(sent1) - base)) -ge 4096 ] || ! alive "$(pid_of sender)"; do sleep 0.01; done
    mark down_at
    val rail1_packets_before_down $(($(sent1) - base))
    $IP link set eth1 down
    val rxe1_state_after_down "$(cat /sys/class/infiniband/rxe1/ports/1/state)"
    finish sender 300
  fi
}

# a's eth1 up again, once rxe1 is ACTIVE with its GID and b's second address answers:
# the next transfer (a new process: the cooldown is per process) tries both rails.
# Soft-RoCE's rxe1, whose netdev went down under traffic, sent rail 1's connection
# request but received nothing more (counters below; an idle link flap does not do
# this, see down_then_up): rail 1 then does not join and rail 0 carries the transfer,
# saying why. (In one guest, on veth, rails.sh makes rxe1 anew and both rails carry.)
case_back_up() {
  if [ "$ROLE" = b ]; then
    receiver 7483
    wait_outcomes receiver 1 300
    stop receiver
  else
    local s0 r0
    $IP link set eth1 up
    if until_true 30 active && until_true 30 has_gid && until_true 30 reaches_peer; then
      val rail1_back yes
    else
      val rail1_back no
    fi
    mark up_at
    s0=$(sent1) r0=$(rcvd1)
    striped first 7483 --size 256MiB
    val rxe1_sent_first "$(($(sent1) - s0))"
    val rxe1_rcvd_first "$(($(rcvd1) - r0))"
  fi
}

# An idle link flap: a's eth1 down between transfers. Naming rxe1 (--nic) is then an
# error, before anything is sent; without --nic the routes pick each rail's device and
# rail 1 cannot join (rail 0 carries the transfer, saying why). eth1 up, and the next
# transfer uses both rails again, with no device made anew.
case_down_then_up() {
  if [ "$ROLE" = b ]; then
    receiver 7485
    wait_outcomes receiver 2 300
    stop receiver
  else
    $IP link set eth1 down
    until_true 10 sh -c '! grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state'
    val rxe1_state_down "$(cat /sys/class/infiniband/rxe1/ports/1/state)"
    run refused 30 host "$RAILS" 7485 --nic rxe0,rxe1 --op write --gpu none --transport rdma --size 64MiB --timeout 10 --json
    send_retry while_down 120 host "$RAILS" 7485 --op write --gpu none --transport rdma --size 64MiB --timeout 10 --json
    $IP link set eth1 up
    if until_true 30 active && until_true 30 has_gid && until_true 30 reaches_peer; then
      val rail1_back yes
    else
      val rail1_back no
    fi
    striped after_up 7485 --size 256MiB
  fi
}

# a's eth0 (rail 0's link: the rail that carried the offer and the accept) goes down in
# the middle of a 256 MiB transfer: rail 0 fails like any rail, its chunks move to rail
# 1, and b's ack comes on rail 1 (b sends it on every rail it has up). The same
# process's second transfer (--iters 2) finds rail 0 resting or down and goes over rail
# 1 alone. Alone in its boot: a's rxe0 is not trusted after.
case_control_rail_down() {
  if [ "$ROLE" = b ]; then
    receiver 7487
    wait_outcomes receiver 3 240
    stop receiver
  else
    local base
    send_retry ready 90 host "$PEER_ADDR" 7487 --gpu none --transport rdma --size 1MiB --timeout 10
    base=$(sent0)
    start sender host "$RAILS" 7487 --nic rxe0,rxe1 --op write --gpu none --transport rdma \
      --timeout 10 --json --size 256MiB --chunk 256KiB --iters 2
    until [ $(($(sent0) - base)) -ge 4096 ] || ! alive "$(pid_of sender)"; do sleep 0.01; done
    mark down_at
    $IP link set eth0 down
    val rxe0_state_after_down "$(cat /sys/class/infiniband/rxe0/ports/1/state)"
    finish sender 300
  fi
}

# b's eth1 goes down in the middle of a 256 MiB transfer: a's rxe1 stays ACTIVE and gets
# no event; its packets go out and nothing comes back. a learns it only from silence:
# rail 1 fails by --rail-timeout (0.5 s without a completion while rail 0 completes),
# before rxe's own retries would end in an error. Last in its boot: b's rxe1 is not
# trusted after.
case_far_end_down() {
  if [ "$ROLE" = b ]; then
    local base
    base=$(rcvd1)
    receiver 7486
    until [ $(($(rcvd1) - base)) -ge 4096 ] || ! alive "$(pid_of receiver)"; do sleep 0.01; done
    mark down_at
    val rail1_packets_before_down $(($(rcvd1) - base))
    $IP link set eth1 down
    wait_outcomes receiver 2 240
    stop receiver
  else
    send_retry ready 90 host "$PEER_ADDR" 7486 --gpu none --transport rdma --size 1MiB --timeout 10
    run sender 180 host "$RAILS" 7486 --nic rxe0,rxe1 --op write --gpu none --transport rdma \
      --timeout 10 --json --size 256MiB --chunk 256KiB --rail-timeout 0.5
  fi
}

if second_rail; then
  val second_rail rxe1
else
  val second_rail failed
  $RDMA link show 2>&1
  $IP addr show eth1 2>&1
fi
ALL="striped down_then_up far_end_down"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
