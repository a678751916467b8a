#!/bin/sh
# bench-guest.sh - the guest half of bench.sh: inside a Soft-RoCE guest, measure the
# project's sender (`host`) and perftest on the same rxe device, one after the other,
# round after round, and print one line per measurement:
#
#   @@BENCH perftest <test> size=<bytes> n=<messages> round=<r> rc=<exit> attempts=<k> | <its result line>
#   @@BENCH ours <test> size=<bytes> n=<messages> round=<r> rc=<exit> | <JSON extract>
#   @@BENCH env <key> | <value>
#
# bench.sh turns these into one JSON document (tests/src/bin/softroce_bench.rs).
# Tests: send_bw, write_bw (each size), send_lat (the latency size): perftest's
# ib_send_bw -R / ib_write_bw -R / ib_send_lat -R, and ours with the same message size,
# message count and depth. Topology one: everything here, against this guest's own
# address. Topology two: ROLE a runs the clients/senders, ROLE b the servers/receivers,
# both walking the same sequence.
#
# Settings (environment, from bench.sh): BENCH_ROUNDS, BENCH_DEPTH, BENCH_SIZES,
# BENCH_BYTES (bytes per throughput measurement; messages = BYTES / size, capped),
# BENCH_LAT_SIZE, BENCH_LAT_ITERS.
set -u
ROUNDS=${BENCH_ROUNDS:-3}
DEPTH=${BENCH_DEPTH:-128}
SIZES=${BENCH_SIZES:-4096 65536 1048576}
BYTES=${BENCH_BYTES:-209715200}
MAX_MSGS=${BENCH_MAX_MSGS:-16384}
LAT_SIZE=${BENCH_LAT_SIZE:-16384}
LAT_ITERS=${BENCH_LAT_ITERS:-1000}
DEV=${RXE_DEV:-rxe0}
SERVER=$PEER_ADDR          # where the receivers listen (topology one: ourselves)
PORT=7471                  # our event-driven receiver, up for the whole run
LAT_PORT=7472              # our busy-polling receiver, up only for its measurement
ROLE=${ROLE:-a}
TWO=no; [ "${SOFTROCE_TOPOLOGY:-one}" = two ] && TWO=yes

msgs_for() { m=$((BYTES / $1)); [ "$m" -gt "$MAX_MSGS" ] && m=$MAX_MSGS; [ "$m" -lt 5 ] && m=5; echo "$m"; }
emit() { echo "@@BENCH $*"; }

# --- the environment, once ---------------------------------------------------------
if [ "$ROLE" = a ]; then
  emit "env kernel | $(uname -r)"
  emit "env cpus | $(grep -c ^processor /proc/cpuinfo)"
  emit "env mem_kib | $(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
  emit "env device | $DEV"
  emit "env active_mtu | $(ibv_devinfo -d "$DEV" 2>/dev/null | awk '/active_mtu/ { print $2, $3; exit }')"
  emit "env netdev_mtu | $(cat /sys/class/net/${RXE_NETDEV:-veth0}/mtu 2>/dev/null || echo '?')"
  emit "env perftest | $(ib_send_bw --version 2>&1 | head -n1)"
  emit "env host | $(host --version 2>&1 | head -n1)"
  emit "env topology | ${SOFTROCE_TOPOLOGY:-one}"
fi

# --- perftest: server in the background (or on b), client here with retries ----------
# $1 test name, $2 tool, $3 size, $4 messages, rest: extra options for both sides.
# perftest times with the TSC and calibrates it against gettimeofday at start; under
# TCG that calibration fails now and then (it then prints inf, -nan or 0.00, or "Can't
# produce a report"). Such a run measured nothing, so it is repeated (twice at most).
# Only with one guest: with two, b could not know that a repeats.
perftest_run() {
  name=$1 tool=$2 size=$3 n=$4; shift 4
  attempt=1
  while :; do
    perftest_once "$@"
    [ "$TWO" = yes ] && break
    # The figure used: BW average (field 4) or t_typical (field 5), finite and > 0.
    col=4; case $name in *_lat) col=5 ;; esac
    echo "$line" | awk -v c=$col '{ exit !($0 !~ /inf|nan/ && $c + 0 > 0) }' && break
    [ $attempt -lt 3 ] || break
    attempt=$((attempt + 1))
  done
  [ "$TWO" = yes ] && [ "$ROLE" = b ] && return
  emit "perftest $name size=$size n=$n round=$round rc=$rc attempts=$attempt | $line"
  if [ $rc -ne 0 ]; then sed 's/^/perftest client: /' /tmp/pt-client.out | tail -n 5; fi
}

perftest_once() {
  line= rc=0
  if [ "$TWO" = yes ] && [ "$ROLE" = b ]; then
    timeout 120 "$tool" -R -F -d "$DEV" -s "$size" -n "$n" "$@" > /tmp/pt-server.out 2>&1
    return
  fi
  spid=
  if [ "$TWO" = no ]; then
    timeout 120 "$tool" -R -F -d "$DEV" -s "$size" -n "$n" "$@" > /tmp/pt-server.out 2>&1 &
    spid=$!
  fi
  tries=0
  while :; do
    sleep 1
    timeout 120 "$tool" -R -F -d "$DEV" -s "$size" -n "$n" "$@" "$SERVER" > /tmp/pt-client.out 2>&1
    rc=$?
    # No listener yet: the client fails at once; retry, bounded.
    if [ $rc -eq 0 ] || grep -q '#bytes' /tmp/pt-client.out; then break; fi
    tries=$((tries + 1)); [ $tries -lt 30 ] || break
  done
  [ -n "$spid" ] && wait "$spid"
  line=$(awk '/#bytes/ { if ((getline l) > 0) print l; exit }' /tmp/pt-client.out)
}

# --- ours: JSON of the sender, boiled down to what bench.sh needs -----------------------
# $1 test name, $2 port, $3 size, $4 messages, rest: sender options.
ours_extract() {
  ok=$(sed -nE 's/^\{.*"ok":(true|false).*/\1/p' /tmp/ours.json | head -n1)
  agg=$(sed -nE 's/.*"aggregate":(\{[^}]*\}).*/\1/p' /tmp/ours.json | head -n1)
  rt=$(sed -nE 's/.*"round_trip":(\{[^}]*\}|null).*/\1/p' /tmp/ours.json | head -n1)
  echo "{\"ok\":${ok:-false},\"aggregate\":${agg:-null},\"round_trip\":${rt:-null}}"
}

ours_run() {
  name=$1 port=$2 size=$3 n=$4; shift 4
  [ "$TWO" = yes ] && [ "$ROLE" = b ] && return
  tries=0
  while :; do
    timeout 120 host "$SERVER" "$port" --gpu none "$@" --json > /tmp/ours.json 2> /tmp/ours.err
    rc=$?
    # Topology two: b's receiver may not be up yet.
    if [ $rc -eq 0 ] || ! grep -q 'no receiver' /tmp/ours.err; then break; fi
    tries=$((tries + 1)); [ $tries -lt 30 ] || break
    sleep 1
  done
  emit "ours $name size=$size n=$n round=$round rc=$rc | $(ours_extract)"
  if [ $rc -ne 0 ]; then sed 's/^/ours: /' /tmp/ours.err | tail -n 5; fi
}

# Our receivers: the event-driven one serves every throughput run and the event-mode
# latency run; the busy-polling one is started for its one run only (spinning, it would
# take a CPU from everything else).
recv_pid=
if [ "$ROLE" = b ] || [ "$TWO" = no ]; then
  host recv --gpu none --mem host --port $PORT --timeout 60 --max-bytes 4GiB > /tmp/recv.out 2>&1 &
  recv_pid=$!
fi
sleep 1

round=1
while [ $round -le "$ROUNDS" ]; do
  for size in $SIZES; do
    n=$(msgs_for "$size")
    perftest_run send_bw ib_send_bw "$size" "$n" -t "$DEPTH"
    ours_run send_bw $PORT "$size" "$n" --op send --size $((size * n)) --chunk "$size" --depth "$DEPTH" --timeout 30
    perftest_run write_bw ib_write_bw "$size" "$n" -t "$DEPTH"
    ours_run write_bw $PORT "$size" "$n" --op write --size $((size * n)) --chunk "$size" --depth "$DEPTH" --timeout 30
  done
  perftest_run send_lat ib_send_lat "$LAT_SIZE" "$LAT_ITERS"
  # Ours, like perftest: both sides busy-poll; one connection, LAT_ITERS round trips.
  if [ "$ROLE" = b ] || [ "$TWO" = no ]; then
    timeout 300 host recv --gpu none --mem host --port $LAT_PORT --busy-poll --once --timeout 30 > /tmp/recv-lat.out 2>&1 &
    lat_pid=$!
    [ "$TWO" = no ] && sleep 1
  fi
  ours_run send_lat $LAT_PORT "$LAT_SIZE" "$LAT_ITERS" --size "$LAT_SIZE" --chunk "$LAT_SIZE" --depth 1 \
    --iters "$LAT_ITERS" --reuse-connection --busy-poll --timeout 30
  if [ "$TWO" = no ]; then
    # The receiver ends with the connection; if the sender never connected, stop it.
    i=0; while kill -0 "$lat_pid" 2>/dev/null && [ $i -lt 10 ]; do sleep 1; i=$((i + 1)); done
    kill "$lat_pid" 2>/dev/null; wait "$lat_pid" 2>/dev/null
  elif [ "$ROLE" = b ]; then
    wait "$lat_pid"
  fi
  # Ours in the default event-driven mode (both sides sleep until a completion).
  ours_run send_lat_event $PORT "$LAT_SIZE" "$LAT_ITERS" --size "$LAT_SIZE" --chunk "$LAT_SIZE" --depth 1 \
    --iters "$LAT_ITERS" --reuse-connection --timeout 30
  round=$((round + 1))
done

if [ -n "$recv_pid" ]; then
  # Topology two: b waits here until a is done (a's last run needs this receiver).
  if [ "$TWO" = yes ]; then
    i=0; n_expected=$((ROUNDS * ($(echo $SIZES | wc -w) * 2 + 1)))
    while [ "$(grep -c '^received' /tmp/recv.out)" -lt "$n_expected" ] && [ $i -lt 600 ]; do sleep 1; i=$((i + 1)); done
  fi
  kill "$recv_pid" 2>/dev/null
  wait "$recv_pid" 2>/dev/null
  fails=$(grep -c '^error\|^receiver: rejected\|does not match' /tmp/recv.out)
  [ "$fails" -eq 0 ] || { echo "receiver problems:"; grep '^error\|^receiver: rejected\|does not match' /tmp/recv.out | head -n 5; }
fi
emit "done | $ROLE"
exit 0
