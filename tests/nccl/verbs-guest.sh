#!/usr/bin/env bash
# verbs-guest.sh - the NCCL plugin's harness over RDMA verbs, in a Soft-RoCE QEMU guest
# (tests/softroce/run-guest.sh): the harness binary and the plugin go into the guest,
# which runs the harness's verbs_ tests; each starts a child whose plugin goes over
# verbs (NCCL_GRDMA_TRANSPORT=verbs) on rxe0's interface. Exit code: the harness's.
#
#   tests/nccl/verbs-guest.sh [PLUGIN.so]    (default: tests/nccl/build-plugin.sh's)
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
# In the guest: the verbs tests of the harness, one at a time (each starts a child).
export NCCL_GRDMA_PLUGIN=/opt/plugin/libnccl-net-grdma.so
nccl-harness verbs_ --test-threads=1
INNER
exec tests/softroce/run-guest.sh --timeout "${TIMEOUT:-600}" \
  --bin "$STAGE/bin" --tree "$STAGE/lib=/opt/plugin" -- "$GUEST"
