#!/usr/bin/env bash
# verbs-guest.sh - the NCCL plugin's harness over RDMA verbs, in a Soft-RoCE QEMU guest
# (tests/softroce/run-guest.sh): the harness binary and the plugin go into the guest,
# which runs the harness's verbs_ tests; each starts a child whose plugin goes over
# verbs (NCCL_GRDMA_TRANSPORT=verbs) on rxe0's interface. Exit code: the harness's.
#
#   tests/nccl/verbs-guest.sh [PLUGIN.so]    (default: tests/nccl/build-plugin.sh's)
#   BENCH=1 tests/nccl/verbs-guest.sh        # instead: the harness's bench_loopback over
#       verbs (checks on, then off) against perftest's ib_write_bw at the same sizes and
#       depth on the same rxe device, one JSON line per figure (@@BENCH lines)
set -euo pipefail
cd "$(dirname "$0")/../.."
PLUGIN=${1:-$(bash tests/nccl/build-plugin.sh)}
HARNESS=$(cargo test -p nccl-net --test harness --no-run --locked --message-format=json 2>/dev/null |
  python3 -c 'import sys, json
for l in sys.stdin:
    d = json.loads(l)
    if d.get("executable") and d.get("target", {}).get("name") == "harness": print(d["executable"])')
[[ -x $HARNESS ]] || { echo "verbs-guest.sh: the harness did not build" >&2; exit 2; }
STAGE=target/nccl-verbs-guest
rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib"
cp "$HARNESS" "$STAGE/bin/nccl-harness"
cp "$PLUGIN" "$STAGE/lib/libnccl-net-grdma.so"
GUEST=$STAGE/guest.sh
cat > "$GUEST" <<'INNER'
#!/bin/sh
export NCCL_GRDMA_PLUGIN=/opt/plugin/libnccl-net-grdma.so
if [ -z "$BENCH" ]; then
  # The verbs tests of the harness, one at a time (each starts a child).
  exec nccl-harness verbs_ --test-threads=1
fi
# The plugin over verbs, then perftest doing the same: messages of the same sizes, 8 in
# flight (perftest's -t), one after the other on rxe0. GB/s are 1e9 bytes/s.
export NCCL_GRDMA_TRANSPORT=verbs NCCL_SOCKET_IFNAME=$RXE_NETDEV GRDMA_BENCH_SCALE=${SCALE:-8}
for checks in 1 0; do
  NCCL_GRDMA_CHECKS=$checks nccl-harness --ignored --exact bench_loopback --nocapture 2>/dev/null |
    sed -n "s/^{\(.*\)}$/@@BENCH {\"who\": \"grdma-verbs\", \"checks\": $checks, \1}/p"
done
for size in 131072 524288 4194304 67108864; do
  n=$(( (1073741824 / ${SCALE:-8}) / size )); [ $n -ge 8 ] || n=8
  timeout 120 ib_write_bw -F -d "$RXE_DEV" -s $size -n $n -t 8 > /tmp/pt-server.out 2>&1 &
  spid=$!
  tries=0
  while :; do
    sleep 1
    timeout 120 ib_write_bw -F -d "$RXE_DEV" -s $size -n $n -t 8 "$RXE_ADDR" > /tmp/pt-client.out 2>&1
    rc=$?
    if [ $rc -eq 0 ] || grep -q '#bytes' /tmp/pt-client.out; then break; fi
    tries=$((tries + 1)); [ $tries -lt 20 ] || break
  done
  wait $spid
  # "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
  awk -v s=$size '/#bytes/ { if ((getline l) > 0) { split(l, f); printf "@@BENCH {\"who\": \"perftest ib_write_bw\", \"size\": %d, \"depth\": 8, \"messages\": %d, \"GBps\": %.3f}\n", s, f[2], f[4] * 1048576 / 1e9 }; exit }' /tmp/pt-client.out
done
INNER
exec tests/softroce/run-guest.sh --timeout "${TIMEOUT:-600}" --env "BENCH=${BENCH:-}" \
  --env "SCALE=${SCALE:-8}" --bin "$STAGE/bin" --tree "$STAGE/lib=/opt/plugin" -- "$GUEST"
