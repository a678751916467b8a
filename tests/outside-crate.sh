#!/usr/bin/env bash
# A crate outside the workspace (tests/outside-crate/) depends on `host` with its
# default features (GPU support included) and is built on stable Rust, as a user's
# program would be: it must build without the nightly or llvm-tools (host embeds the PTX
# kept in gpu-kernels/ptx/), then send 8 MiB + 3 B over TCP loopback and get them back
# equal (from GPU memory where there is a GPU). Dependencies at the workspace's versions
# (its Cargo.lock). Skips, saying why, only where no stable toolchain is installed.
#
#   tests/outside-crate.sh            # OUTSIDE_BIN_DIR=DIR: also copy the binary there
set -euo pipefail
cd "$(dirname "$0")/outside-crate"
# As a user builds it: the build script decides where the PTX comes from (run-all.sh
# forces `built` for the workspace, which stable cannot do).
unset HOST_PTX
toolchain=${OUTSIDE_TOOLCHAIN:-stable}
if ! rustup run "$toolchain" rustc -V >/dev/null 2>&1; then
    echo "SKIPPED outside-crate: no $toolchain toolchain installed (rustup toolchain list: $(rustup toolchain list | tr '\n' ' '))"
    exit 0
fi
echo "outside-crate: $(rustup run "$toolchain" rustc -V)"
cp ../../Cargo.lock Cargo.lock
cargo "+$toolchain" build --release --quiet
./target/release/outside-crate
if [ -n "${OUTSIDE_BIN_DIR:-}" ]; then cp target/release/outside-crate "$OUTSIDE_BIN_DIR/"; fi
