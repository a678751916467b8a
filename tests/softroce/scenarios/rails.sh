# rails.sh - a verbs transfer striped over two rails, and failing over (issue 19).
# Topology one: rxe0 on veth0 is there (guest-init.sh); this script adds a second rail,
# rxe1 on veth2 (198.51.100.1/24, its peer veth3 up for carrier). Sender and receiver
# share the guest, so rxe loops each rail's packets back inside its device; taking veth2
# down makes rxe1's port go DOWN, and the port-down event may be the only signal a
# sender gets. Run by tests/tests/softroce.rs; output format: lib.sh.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR
B=198.51.100.1
IP=/usr/bin/ip
RDMA=/usr/bin/rdma

# port_state DEV: the word after the number in its port's state (ACTIVE, DOWN, ...).
port_state() {
  local s
  read -r s < "/sys/class/infiniband/$1/ports/1/state"
  echo "${s##* }"
}

# wait_active DEV SECS: until DEV's port is ACTIVE; 1 on timeout.
wait_active() {
  local bound=$(($2 * 100)) t0
  t0=$(now_cs)
  until [ "$(port_state "$1")" = ACTIVE ]; do
    [ $(($(now_cs) - t0)) -ge "$bound" ] && return 1
    sleep 0.1
  done
}

# The second rail, as guest-init.sh makes the first: the device, then the address, then
# its RoCE v2 GID.
second_rail() {
  local mtu
  $IP link add veth2 type veth peer name veth3 || return 1
  # The first rail's MTU (guest-init.sh's, 9000 by default): two alike rails, so that a
  # difference between them is not the MTU's (at 1500, rxe1 ran at 0.04 GB/s to rxe0's
  # 0.07-0.09 in `host bench rails`; at 9000 both at 0.08).
  mtu=$(cat /sys/class/net/veth0/mtu)
  $IP link set veth2 mtu "$mtu" || return 1
  $IP link set veth3 mtu "$mtu" || return 1
  $IP link set veth3 up
  $IP link set veth2 up
  $RDMA link add rxe1 type rxe netdev veth2 || return 1
  wait_active rxe1 10 || return 1
  $IP addr add "$B/24" dev veth2 || return 1
  wait_gid 10
}

# wait_gid SECS: until rxe1 has the RoCE v2 GID of $B (the kernel drops a netdev's GIDs
# when it goes down and adds them again, later, when it comes up); 1 on timeout.
wait_gid() {
  local bound=$(($1 * 100)) t0
  t0=$(now_cs)
  until cat /sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null | grep -q ':ffff:c633:6401$'; do
    [ $(($(now_cs) - t0)) -ge "$bound" ] && return 1
    sleep 0.1
  done
}

# Receive completions on rxe1 (rail 1's chunks at the receiver).
recvs1() { local n; read -r n < /sys/class/infiniband/rxe1/ports/1/hw_counters/rdma_recvs; echo "$n"; }

receiver() {
  start receiver host recv --gpu none --transport rdma --timeout 10 --json
  wait_for receiver "receiver: listening" 30
}

striped() {
  host "$A,$B" 7471 --nic rxe0,rxe1 --op write --gpu none --transport rdma --timeout 10 --json "$@"
}

# Both rails carry chunks of one 256 MiB transfer.
case_striped() {
  receiver
  run striped 120 striped --size 256MiB
  wait_outcomes receiver 1 30
  stop receiver
}

# host bench rails over the two verbs rails: each alone, then both striped, interleaved;
# every transfer verified (in the guest the rate is rxe's CPU, not a NIC's: informational).
case_bench() {
  receiver
  run bench 240 host bench rails "$A,$B" 7471 --nic rxe0,rxe1 --size 64MiB --rounds 2 --timeout 10
  wait_outcomes receiver 6 30
  stop receiver
}

# veth2 goes down in the middle: rail 1 fails (the port-down event), its chunks in flight
# go to rail 0, the transfer verifies.
case_failover() {
  local base
  receiver
  base=$(recvs1)
  start sender striped --size 256MiB --chunk "${FAILOVER_CHUNK:-256KiB}"
  until [ $(($(recvs1) - base)) -ge 64 ] || ! alive "$(pid_of sender)"; do sleep 0.01; done
  mark down_at
  val rail1_chunks_before_down $(($(recvs1) - base))
  $IP link set veth2 down
  val rxe1_state_after_down "$(port_state rxe1)"
  val rxe1_gids_after_down "$(cat /sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null | grep -vc '^0000:0000:0000:0000:0000:0000:0000:0000$')"
  finish sender 120
  wait_outcomes receiver 1 30
  stop receiver
}

# veth2 up again, rxe1 ACTIVE with its GID: the next transfer verifies whether or not
# rail 1 joins (Soft-RoCE answered no connection requests on rxe1 for a minute and more
# after its port went down under traffic: the join then times out in 2 s and rail 0
# carries the transfer alone, saying so). Then rxe1 is made anew (its address removed
# and added again for the GID): the next transfer (a new process: the cooldown is per
# process) uses both rails.
case_back_up() {
  $IP link set veth2 up
  if wait_active rxe1 30 && wait_gid 30; then val rxe1_active yes; else val rxe1_active no; fi
  mark up_at
  receiver
  run first 120 striped --size 256MiB
  $IP addr del "$B/24" dev veth2
  $RDMA link delete rxe1
  $RDMA link add rxe1 type rxe netdev veth2
  wait_active rxe1 30
  $IP addr add "$B/24" dev veth2
  if wait_gid 30; then val rxe1_anew yes; else val rxe1_anew no; fi
  run again 120 striped --size 256MiB
  wait_outcomes receiver 2 30
  stop receiver
}

# One address: no striping, nothing about rails (the wire is as before). --op send with
# two addresses is striped too (issue 25): each SEND lands in a slot of the rail it came
# on and is copied into its place.
case_one_rail_unchanged() {
  receiver
  run one 60 host "$A" 7471 --op write --gpu none --transport rdma --size 64MiB --timeout 10 --json
  run send_op 60 host "$A,$B" 7471 --nic rxe0,rxe1 --op send --gpu none --transport rdma --size 64MiB --timeout 10 --json
  wait_outcomes receiver 2 30
  stop receiver
}

# Everything an unstriped transfer has, striped (issue 25): a file of 64 MiB + 3 bytes
# with --verify checksum and faults injected at 1/100, over WRITE and SEND, stored by the
# receiver (the same SHA-256, the repaired list the injected chunks'); the same three
# times over --reuse-connection; and one chunk in three corrupted on every sending
# (1/3), repaired until whole.
case_striped_checked() {
  mkdir -p /tmp/out
  head -c 67108867 /dev/urandom > /tmp/in.bin
  sha256sum /tmp/in.bin | cut -d' ' -f1 > /tmp/in.sha
  val input_sha256 "$(cat /tmp/in.sha)"
  start receiver host recv --gpu none --transport rdma --timeout 10 --json --output /tmp/out
  wait_for receiver "receiver: listening" 30
  run file_write 180 striped --input /tmp/in.bin --name w.bin --verify checksum --test-inject-faults 1/100 --chunk 256KiB
  run file_send 180 host "$A,$B" 7471 --nic rxe0,rxe1 --op send --gpu none --transport rdma --timeout 10 --json \
    --input /tmp/in.bin --name s.bin --verify checksum --test-inject-faults 1/100 --chunk 256KiB
  run reused 180 striped --size 16MiB --verify checksum --test-inject-faults 1/100 --chunk 64KiB --iters 3 --reuse-connection
  run thirds_write 180 striped --size 16MiB --verify checksum --test-inject-faults 1/3 --chunk 64KiB
  run thirds_send 180 host "$A,$B" 7471 --nic rxe0,rxe1 --op send --gpu none --transport rdma --timeout 10 --json \
    --size 16MiB --verify checksum --test-inject-faults 1/3 --chunk 64KiB
  wait_outcomes receiver 5 60
  stop receiver
  val w_sha256 "$(sha256sum /tmp/out/w.bin 2>/dev/null | cut -d' ' -f1)"
  val s_sha256 "$(sha256sum /tmp/out/s.bin 2>/dev/null | cut -d' ' -f1)"
}

# A receiver with --key-file: rail 0 proves the key; a further rail could join only by
# the token rail 0 was given, so a keyed transfer goes over the first rail alone (the
# sender says why).
case_key() {
  head -c 32 /dev/urandom > /tmp/rails.key
  start receiver host recv --gpu none --transport rdma --timeout 10 --json --key-file /tmp/rails.key
  wait_for receiver "receiver: listening" 30
  run keyed 120 striped --size 64MiB --key-file /tmp/rails.key
  wait_outcomes receiver 2 30
  stop receiver
}

if second_rail; then
  echo "@@VAL second_rail=rxe1@@"
else
  echo "@@VAL second_rail=failed@@"
  $RDMA link show 2>&1
fi
ALL="striped bench failover back_up one_rail_unchanged striped_checked key"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
