#!/bin/sh
# selftest-guest.sh - runs INSIDE a Soft-RoCE guest (busybox sh), started by
# selftest.sh through run-guest.sh. It proves that real verbs work:
#   devices      ibv_devices lists rxe0
#   link         `rdma link` shows rxe0's port ACTIVE
#   rdma_cm      rdma_server / rdma_client (librdmacm's example) exchange a message
#   send_bw      ib_send_bw -R (perftest over rdma_cm), 200 x 1 MiB
# Topology one: server and client both run here, on RXE_ADDR.
# Topology two: guest b is the server, guest a the client (to PEER_ADDR).
# Each part prints one line
#   SELFTEST <part> <ok|FAIL> <seconds>s [<detail>]
# and the script exits non-zero if any part failed.

SIZE=${SELFTEST_SIZE:-1048576}     # ib_send_bw message size (bytes)
ITERS=${SELFTEST_ITERS:-200}       # ib_send_bw iterations
FAILED=0

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
report() {   # report PART RC START [DETAIL]
  if [ "$2" = 0 ]; then st=ok; else st=FAIL; FAILED=1; fi
  echo "SELFTEST $1 $st $(since "$3")s $4"
}

# Who does what. In topology one this guest is both server and client.
case "$SOFTROCE_TOPOLOGY/$ROLE" in
  one/*) SERVER=1 CLIENT=1 ;;
  two/b) SERVER=1 CLIENT=0 ;;
  two/a) SERVER=0 CLIENT=1 ;;
esac
SERVER_ADDR=$RXE_ADDR
[ "$SOFTROCE_TOPOLOGY" = two ] && [ "$ROLE" = a ] && SERVER_ADDR=$PEER_ADDR

# retry N CMD...: run CMD until it succeeds, at most N times, 1 s apart.
# Used by the client side: the server may not be listening yet. Stops early
# if our own server (pid $spid, topology one) has died.
retry() {
  n=$1; shift
  k=1
  while :; do
    "$@" && return 0
    [ "$k" -ge "$n" ] && return 1
    if [ "$SERVER" = 1 ] && ! kill -0 "$spid" 2>/dev/null; then return 1; fi
    k=$((k + 1)); sleep 1
  done
}

# --- devices, link ------------------------------------------------------------
t=$(now)
ibv_devices | tee /tmp/devices
grep -q rxe0 /tmp/devices
report devices $? "$t"

t=$(now)
/usr/bin/rdma link | tee /tmp/link
grep -q 'rxe0/1 state ACTIVE' /tmp/link
report link $? "$t"

# --- rdma_server / rdma_client --------------------------------------------------
t=$(now)
rc=0
if [ "$SERVER" = 1 ]; then
  timeout 60 rdma_server -s "$RXE_ADDR" > /tmp/rdma_server.log 2>&1 &
  spid=$!
fi
if [ "$CLIENT" = 1 ]; then
  [ "$SERVER" = 1 ] && sleep 0.5
  retry 20 timeout 30 rdma_client -s "$SERVER_ADDR" || rc=1
fi
if [ "$SERVER" = 1 ]; then
  wait "$spid" || rc=1
  cat /tmp/rdma_server.log
fi
report rdma_cm $rc "$t"

# --- ib_send_bw -R ----------------------------------------------------------------
# perftest with rdma_cm (-R): the server waits for one client, then both
# report. -F: do not fail on missing cpufreq information (a VM has none).
t=$(now)
rc=0
PERF="ib_send_bw -R -F -d rxe0 -s $SIZE -n $ITERS"
if [ "$SERVER" = 1 ]; then
  # shellcheck disable=SC2086  # $PERF is a word list on purpose
  timeout 120 $PERF > /tmp/bw_server.log 2>&1 &
  spid=$!
fi
if [ "$CLIENT" = 1 ]; then
  [ "$SERVER" = 1 ] && sleep 1
  # shellcheck disable=SC2086
  retry 20 timeout 120 $PERF "$SERVER_ADDR" > /tmp/bw_client.log 2>&1 || rc=1
  cat /tmp/bw_client.log
fi
if [ "$SERVER" = 1 ]; then
  wait "$spid" || rc=1
  [ "$CLIENT" = 1 ] || cat /tmp/bw_server.log
fi
# The result row: "<bytes> <iters> <peak MB/s> <average MB/s> <Mpps>".
log=/tmp/bw_client.log
[ "$CLIENT" = 1 ] || log=/tmp/bw_server.log
bw=$(awk -v s="$SIZE" '$1 == s && NF >= 5 { print $4 }' "$log" | tail -n 1)
# An empty or zero figure (perftest could not time the run) is a failure.
awk -v b="${bw:-0}" 'BEGIN { exit !(b > 0) }' || rc=1
report send_bw $rc "$t" "${bw:-?} MB/s (${ITERS} x ${SIZE} B)"

exit $FAILED
