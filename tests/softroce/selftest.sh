#!/usr/bin/env bash
# selftest.sh - prove that the Soft-RoCE test bed works.
#
# Boots the guest(s) with run-guest.sh and runs selftest-guest.sh inside:
# ibv_devices, `rdma link`, rdma_server/rdma_client, and
# `ib_send_bw -R -s 1048576 -n 200` - in topology one (one guest) and two
# (two guests). Prints the guests' output, then a table with the time of
# each part and the bandwidth, then "selftest: N passed, N failed".
#
# Usage: selftest.sh [--topology one|two|both] [-q|--quiet]
#   --topology   which topologies to run (default both)
#   -q           hide the guests' console output (the table still shows)
# Environment: SELFTEST_SIZE, SELFTEST_ITERS change the ib_send_bw message
# size and count (defaults 1048576 and 200).
# Exit code: 0 when every part passed in every topology.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

TOPOLOGIES=(one two) QUIET=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --topology)
      case ${2:-} in
        one|two) TOPOLOGIES=("$2") ;;
        both) TOPOLOGIES=(one two) ;;
        *) echo "selftest.sh: --topology one|two|both" >&2; exit 2 ;;
      esac
      shift 2 ;;
    -q|--quiet) QUIET=(--quiet); shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "selftest.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

ENV_ARGS=()
[[ -n ${SELFTEST_SIZE:-} ]] && ENV_ARGS+=(--env "SELFTEST_SIZE=$SELFTEST_SIZE")
[[ -n ${SELFTEST_ITERS:-} ]] && ENV_ARGS+=(--env "SELFTEST_ITERS=$SELFTEST_ITERS")

OUT=$(mktemp -d "${TMPDIR:-/tmp}/softroce-selftest.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Setup first, timed on its own (cold: downloads; warm: ~0.5 s).
t=$(now)
kver=$("$HERE/setup.sh")
echo "selftest: setup.sh: kernel $kver, $(secs "$t" "$(now)") s"

PASSED=0 FAILED=0
declare -A WALL=() RCS=()
for topo in "${TOPOLOGIES[@]}"; do
  echo "selftest: === topology $topo ==="
  t=$(now)
  rc=0
  # --quiet hides the console, but the SELFTEST lines are still needed:
  # read them from the logs, which --log-dir keeps.
  "$HERE/run-guest.sh" --topology "$topo" --timeout 300 --log-dir "$OUT/$topo" \
    ${QUIET[@]+"${QUIET[@]}"} ${ENV_ARGS[@]+"${ENV_ARGS[@]}"} \
    -- "$HERE/selftest-guest.sh" || rc=$?
  WALL[$topo]=$(secs "$t" "$(now)")
  RCS[$topo]=$rc
done

# The table: one row per guest and part, from the console logs.
echo
printf '%-9s %-6s %-9s %-7s %9s  %s\n' topology guest part result seconds detail
for topo in "${TOPOLOGIES[@]}"; do
  for log in "$OUT/$topo"/?.log; do
    [[ -f $log ]] || continue
    g=$(basename "$log" .log)
    boot=$(grep -a 'softroce-init: ready at' "$log" | sed 's/.*ready at \([0-9.]*\)s.*/\1/' | head -n 1)
    printf '%-9s %-6s %-9s %-7s %9s  %s\n' "$topo" "$g" boot "${boot:+ok}" "${boot:-?}" "kernel start to rxe0 ready"
    while read -r _ part result time detail; do
      printf '%-9s %-6s %-9s %-7s %9s  %s\n' "$topo" "$g" "$part" "$result" "${time%s}" "$detail"
      if [[ $result == ok ]]; then PASSED=$((PASSED + 1)); else FAILED=$((FAILED + 1)); fi
    done < <(grep -a '^SELFTEST ' "$log" | tr -d '\r')
  done
  printf '%-9s %-6s %-9s %-7s %9s  %s\n' "$topo" - total "$([[ ${RCS[$topo]} == 0 ]] && echo ok || echo "FAIL(${RCS[$topo]})")" \
    "${WALL[$topo]}" "run-guest.sh, wall clock"
  # A topology that failed before running its parts counts as one failure.
  if [[ ${RCS[$topo]} != 0 ]] && ! grep -qa 'SELFTEST .* FAIL' "$OUT/$topo"/?.log 2>/dev/null; then
    FAILED=$((FAILED + 1))
  fi
done
echo
echo "selftest: $PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
