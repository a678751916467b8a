#!/usr/bin/env bash
# The main job, on the embedded default: a real RDMA transfer through Soft-RoCE.
#
#   tests/softroce/demo.sh [SENDER OPTIONS...]      e.g.  --size 256MiB --op write
#
# Sets everything up on a fresh Debian machine (toolchain, rdma-core, QEMU, a Debian
# kernel for the guest), builds the `host` binary (without CUDA: the guest has no GPU),
# boots one QEMU guest with a Soft-RoCE device rxe0 on 192.0.2.1, and runs there
#
#   host recv --once                      # the receiver, verifying every element
#   host 192.0.2.1 7471 [OPTIONS...]      # the sender: the seed's command by default
#
# printing both programs' output. Exit code: 0 only if the data arrived verified.
set -euo pipefail
cd "$(dirname "$0")/../.."

echo "==> setting up (first run: a few minutes; later: seconds)" >&2
eval "$(bash tests/setup-env.sh)"
bash tests/softroce/setup.sh >&2
echo "==> building host (release, no CUDA)" >&2
cargo build --release -p host --no-default-features --locked --target-dir target/guest >&2
echo "==> booting a Soft-RoCE guest (QEMU, software emulation: expect tens of MB/s)" >&2
exec tests/softroce/run-guest.sh --timeout 600 --bin target/guest/release/host \
    -- tests/softroce/demo-guest.sh "$@"
