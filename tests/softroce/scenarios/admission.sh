# admission.sh - the verbs receiver under the admission it shares with TCP (issue 16):
# --allow, the --min-rate counted over a reused connection, --transport auto listening on
# TCP too, --key-file. Run by tests/tests/softroce.rs (topology one); output format: lib.sh.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR

# 16a. --allow: a sender outside the list is refused before anything is allocated (the
#      64 MiB it offers is not even reserved); a receiver that allows the guest's network
#      serves the same sender.
case_allow() {
  start outside_receiver host recv --gpu none --timeout 10 --allow 198.51.100.0/24,10.0.0.0/8
  wait_for outside_receiver "receiver: listening" 30
  run outside 30 host "$A" 7471 --gpu none --size 64MiB --timeout 10
  wait_outcomes outside_receiver 1 30
  stop outside_receiver
  start inside_receiver host recv --gpu none --timeout 10 --allow 192.0.2.0/24
  wait_for inside_receiver "receiver: listening" 30
  run inside 30 host "$A" 7471 --gpu none --timeout 10
  wait_outcomes inside_receiver 1 30
  stop inside_receiver
}

# 16b. --min-rate over a --reuse-connection: 1 MiB transfers, the sender running freely
#      for 3 s (about 25 MiB/s here, well above the rate), then stopped (SIGSTOP) for 2.5 s
#      of every 2.6 s. Each wait stays within --timeout 3, and each single transfer within
#      its own --timeout + 1 MiB / rate; but the connection then averages far below
#      --min-rate 8MiB, so the receiver ends it as too slow within a few cycles instead
#      of serving 100000 transfers.
case_reuse_rate() {
  local pid i=0
  start receiver host recv --gpu none --timeout 3 --min-rate 8MiB
  wait_for receiver "receiver: listening" 30
  local base
  base=$(recvs)
  start slow host "$A" 7471 --gpu none --size 1MiB --iters 100000 --reuse-connection --timeout 30
  pid=$(pid_of slow)
  # Stall once 16 transfers have landed, not after a fixed time: a fast guest banks
  # rate credit at full speed meanwhile (3 s at ~80 MiB/s outlasted all 15 cycles in a
  # quiet CI run), and the test is of the average falling, not of how fast rxe is.
  wait_data "$base" 16 30
  mark stalls_started
  while [ $i -lt 15 ] && alive "$pid"; do
    kill -STOP "$pid" 2>/dev/null
    sleep 2.5
    kill -CONT "$pid" 2>/dev/null
    sleep 0.1
    i=$((i + 1))
  done
  val stall_cycles "$i"
  finish slow 60
  mark slow_done
  wait_outcomes receiver 1 30
  stop receiver
}

# 16c. --transport auto on a machine with an RDMA device listens on TCP too: a TCP
#      sender (an auto sender that found no RDMA route here) and a verbs sender are both
#      served by the one receiver.
case_auto_tcp() {
  start receiver host recv --gpu none --timeout 10
  wait_for receiver "receiver: listening" 30
  run tcp 30 host "$A" 7471 --gpu none --transport tcp --size 1MiB --timeout 10
  run rdma 30 host "$A" 7471 --gpu none --transport rdma --size 1MiB --timeout 10
  wait_outcomes receiver 2 30
  stop receiver
}

# 16d. --key-file on verbs: the receiver rejects a first connect request with a fresh
#      nonce; a sender with the same key connects again with its proof and is served; one
#      without a key, or with another, is refused with the reason, and nothing is
#      allocated for their 64 MiB offers (the receiver's peak memory before and after).
case_key() {
  local pid
  echo "correct horse battery staple" > /tmp/key
  echo "incorrect horse battery staple" > /tmp/wrong-key
  start receiver host recv --gpu none --transport rdma --timeout 10 --key-file /tmp/key
  wait_for receiver "receiver: listening" 30
  pid=$(pid_of receiver)
  val peak_before_kib "$(peak_kib "$pid")"
  run good 30 host "$A" 7471 --gpu none --transport rdma --key-file /tmp/key --timeout 10
  run nokey 30 host "$A" 7471 --gpu none --transport rdma --size 64MiB --timeout 10
  run wrong 30 host "$A" 7471 --gpu none --transport rdma --size 64MiB --key-file /tmp/wrong-key --timeout 10
  wait_outcomes receiver 5 30
  val peak_after_kib "$(peak_kib "$pid")"
  stop receiver
}

# peak_kib PID: the process's peak resident memory (VmHWM) in KiB.
peak_kib() {
  local key value _unit
  while read -r key value _unit; do
    [ "$key" = "VmHWM:" ] && { echo "$value"; return; }
  done < /proc/"$1"/status
}

ALL="allow reuse_rate auto_tcp key"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
