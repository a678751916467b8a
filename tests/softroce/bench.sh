#!/usr/bin/env bash
# bench.sh - the project's sender against perftest, in the same Soft-RoCE guest and the
# same run, on the same rxe device; prints one JSON document on stdout.
#
# Usage:
#   tests/softroce/bench.sh [--topology one|two] [--rounds N] [--depth N]
#                           [--sizes "4096 65536 1048576"] [--bytes N] [--lat-iters N]
#                           [--quick] [--bin PATH] [--raw FILE] [--timeout SECS]
#                           [--wait-quiet SECS]
#
# For each message size (default 4 KiB, 64 KiB, 1 MiB) and round:
#   ib_send_bw -R  vs  host <ip> <port> --op send  --chunk SIZE --size N x SIZE
#   ib_write_bw -R vs  host <ip> <port> --op write --chunk SIZE --size N x SIZE
# both with the same message count N (--bytes / SIZE, at most 16384) and the same depth
# (perftest -t, our --depth; default 128, perftest's own default), against `host recv`;
# then the latency at 16 KiB:
#   ib_send_lat -R -s 16384  vs  host --reuse-connection --iters 1000 --busy-poll
#   (against host recv --busy-poll), plus ours in the default event-driven mode.
# The rounds interleave the tools, so a slow moment of the machine hits both; every
# figure in the JSON is the median over the rounds, with the single runs listed.
# What each figure measures is written into the JSON itself (see also BENCH.md).
#
# Options:
#   --topology one|two  one (default): one guest, both ends on its rxe0 (2 vCPUs).
#                       two: senders in guest a, receivers in guest b (1 vCPU each).
#   --rounds N          rounds (default 3).
#   --depth N           work requests in flight, both tools (default 128).
#   --sizes LIST        message sizes in bytes (default "4096 65536 1048576").
#   --bytes N           bytes per throughput measurement (default 200 MiB).
#   --lat-iters N       round trips per latency measurement (default 1000).
#   --quick             1 round, 32 MiB per measurement, 200 round trips (a smoke test).
#   --bin PATH          the `host` binary to test (default: build the guest binary,
#                       cargo build --release -p host --no-default-features
#                       --target-dir target/guest).
#   --raw FILE          also keep the guest's console output in FILE.
#   --timeout SECS      for the guest(s) (default 1800).
#   --wait-quiet SECS   first wait (at most SECS) until no other QEMU runs on this
#                       machine: TCG guests share its cores, and a concurrent guest
#                       halves the figures of both tools and makes them noisy.
# Exit code: 0 when every measurement ran and every transfer verified (the goals may
# still be missed: see "goals" in the JSON), 1 otherwise, 2 for bad usage.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ME=bench.sh
say() { echo "$ME: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

TOPOLOGY=one ROUNDS=3 DEPTH=128 SIZES="4096 65536 1048576" BYTES=$((200 << 20))
LAT_ITERS=1000 BIN= RAW= TIMEOUT=1800 WAIT_QUIET=0
ORIG_ARGS=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --topology) TOPOLOGY=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --depth) DEPTH=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --lat-iters) LAT_ITERS=$2; shift 2 ;;
    --quick) ROUNDS=1 BYTES=$((32 << 20)) LAT_ITERS=200; shift ;;
    --bin) BIN=$2; shift 2 ;;
    --raw) RAW=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --wait-quiet) WAIT_QUIET=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) say "unknown option $1"; usage 2 >&2 ;;
  esac
done
case $TOPOLOGY in one|two) ;; *) say "--topology one|two"; exit 2 ;; esac
for n in "$ROUNDS" "$DEPTH" "$BYTES" "$LAT_ITERS" "$TIMEOUT"; do
  [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { say "not a positive number: $n"; exit 2; }
done
[[ $WAIT_QUIET =~ ^[0-9]+$ ]] || { say "--wait-quiet needs whole seconds"; exit 2; }

cd "$REPO"
eval "$(bash tests/setup-env.sh)"
if [ -z "$BIN" ]; then
  say "building the guest binary (release, no CUDA)"
  cargo build --release -q -p host --no-default-features --target-dir target/guest >&2
  BIN=$REPO/target/guest/release/host
fi
[ -x "$BIN" ] || { say "no executable at $BIN"; exit 2; }
say "building softroce_bench (turns the guest's lines into JSON)"
cargo build -q -p integration-tests --no-default-features --bin softroce_bench >&2
REPORT=$REPO/target/debug/softroce_bench

# run-guest.sh puts --bin files into /opt/bin under their own name: the guest runs `host`.
work=$(mktemp -d "${TMPDIR:-/tmp}/softroce-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cp "$BIN" "$work/bin/host"
raw=${RAW:-$work/console.txt}

qemus() { ps -eo comm | grep -c '^qemu-system' || true; }
waited=0
while [ "$(qemus)" -gt 0 ] && [ $waited -lt "$WAIT_QUIET" ]; do
  [ $waited -eq 0 ] && say "waiting (at most ${WAIT_QUIET} s) for $(qemus) other QEMU process(es) to end"
  sleep 5; waited=$((waited + 5))
done
busy=$(qemus)
[ "$busy" -eq 0 ] || say "warning: $busy other QEMU process(es) running: the figures will be lower and noisier"

say "topology $TOPOLOGY, $ROUNDS round(s), depth $DEPTH, sizes $SIZES, $BYTES bytes per throughput run, $LAT_ITERS round trips"
# While the guest runs, sample every 2 s: the QEMU processes (ours are 1 or 2), the
# machine's busy CPU time and our QEMU's, so the JSON can say how much of the machine
# others used meanwhile (the figures of both tools drop when they do).
own=1; [ "$TOPOLOGY" = two ] && own=2
descendants() { ps -eo pid=,ppid= | awk -v root="$1" '{ kids[$2] = kids[$2] " " $1 }
  END { q = root; while (q != "") { split(q, a, " "); q = ""; for (i in a) { print a[i]; q = q " " kids[a[i]] } } }'; }
sample() { # seconds, machine busy jiffies, our processes' jiffies, QEMU count
  local busy ours=0 p t
  busy=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat)
  for p in $(descendants "$1"); do
    t=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null) && ours=$((ours + ${t:-0}))
  done
  echo "$(date +%s.%N) $busy $ours $(qemus)"
}
rc=0
bash "$HERE/run-guest.sh" --topology "$TOPOLOGY" --timeout "$TIMEOUT" --bin "$work/bin" \
  --env BENCH_ROUNDS="$ROUNDS" --env BENCH_DEPTH="$DEPTH" --env "BENCH_SIZES=$SIZES" \
  --env BENCH_BYTES="$BYTES" --env BENCH_LAT_ITERS="$LAT_ITERS" \
  -- "$HERE/bench-guest.sh" > "$raw" &
guest=$!
( while kill -0 "$guest" 2>/dev/null; do sample "$guest"; sleep 2; done ) > "$work/samples" 2>/dev/null &
sampler=$!
wait "$guest" || rc=$?
wait "$sampler" 2>/dev/null || true
# Samples taken while our guest(s) ran: how often another QEMU was there, and how many
# CPUs everything but our guest(s) used on average (first to last such sample).
read -r others_max others_pct other_cpus < <(awk -v own="$own" -v hz="$(getconf CLK_TCK)" '
  $4 >= own { n++; o = $4 - own; if (o > m) m = o; if (o > 0) b++
              if (n == 1) { t0 = $1; busy0 = $2; ours0 = $3 } t1 = $1; busy1 = $2; ours1 = $3 }
  END { cpus = (t1 > t0) ? ((busy1 - busy0) - (ours1 - ours0)) / hz / (t1 - t0) : 0
        printf "%d %d %.2f\n", m, n ? 100 * b / n : 0, cpus }' "$work/samples")
[ "$others_max" -eq 0 ] || say "warning: another QEMU ran during ${others_pct}% of the run: the figures are disturbed"
say "the rest of the machine used $other_cpus CPUs on average while the guest ran ($(nproc) here)"
[ $rc -eq 0 ] || say "the guest run ended with $rc (console: ${RAW:-kept in $work until exit})"
grep -v '@@BENCH' "$raw" | grep -E '^\[[ab]\] (perftest client|ours|receiver problems|  )' >&2 || true

command="tests/softroce/bench.sh${ORIG_ARGS[*]:+ ${ORIG_ARGS[*]}}"
"$REPORT" --command "$command" \
  --setting "topology=$TOPOLOGY" --setting "rounds=$ROUNDS" --setting "depth=$DEPTH" \
  --setting "bytes_per_throughput_run=$BYTES" --setting "latency_round_trips=$LAT_ITERS" \
  --setting "other_qemu_processes_at_start=$busy" --setting "other_qemu_processes_during_max=$others_max" \
  --setting "other_qemu_during_percent_of_run=$others_pct" \
  --setting "other_processes_cpus_avg=$other_cpus" --setting "machine_cpus=$(nproc)" \
  --setting "waited_for_quiet_s=$waited" \
  "$raw" > "$work/report.json" || rc=1
cat "$work/report.json"
grep -q '"complete": true' "$work/report.json" || rc=1
[ $rc -eq 0 ] || exit 1
