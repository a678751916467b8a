#!/usr/bin/env bash
# The project's whole test suite, as CI runs it (`.ci/run` calls this) and as a new user
# runs it on a fresh Debian machine:
#
#   tests/run-all.sh
#
# 1. installs what the build needs (tests/setup-env.sh) and the Soft-RoCE test bed
#    (tests/softroce/setup.sh: QEMU, a Debian kernel for the guests, rdma-core);
# 2. checks formatting and lints (both builds: with CUDA, and the receiver without), and
#    that the API docs link nothing private or missing;
# 3. builds the no-CUDA binaries the Soft-RoCE guests run (host, the rdma-loopback example);
# 4. runs every test: unit tests, the PTX/ptxas compile check, the GPU tests (skipped
#    with a reason where there is no GPU), the tutorial's examples (examples/), the
#    NCCL net plugin's harness (nccl-net/tests/; its verbs cases again inside a guest)
#    and the RDMA tests inside the guests;
#    then the Python module's tests (pip install ./python in a fresh venv, pytest over
#    TCP loopback, then the same tests over verbs inside a guest);
# 5. runs the host-memory modules under Miri;
# 6. fuzzes the wire-format decoders for 30 s.
# Besides: the PTX kept in gpu-kernels/ptx/ is checked against this build's, and a crate
# outside the workspace is built on stable Rust against the library and run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every build here makes the PTX from the kernels' sources (never the kept copy).
export HOST_PTX=built

step() { printf '\n==> %s\n' "$*"; }

step "setting up the build environment"
eval "$(bash tests/setup-env.sh)"
step "setting up the Soft-RoCE test bed"
bash tests/softroce/setup.sh

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (default features: with CUDA)"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo clippy (host and its examples without CUDA)"
cargo clippy -p host -p host-examples --no-default-features --all-targets --locked -- -D warnings
step "cargo doc (the API docs: no link to a private or missing item)"
# A public doc that links a private item is a dead link for a library user.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "building the guests' binary (host, release, without CUDA)"
cargo build --release -p host --no-default-features --locked --target-dir target/guest
export SOFTROCE_HOST_BIN="$PWD/target/guest/release/host"
step "building the tutorial's verbs example for the guests (examples/host/rdma_loopback.rs)"
cargo build --release -p host-examples --no-default-features --bin rdma-loopback --locked --target-dir target/guest
export SOFTROCE_LOOPBACK_BIN="$PWD/target/guest/release/rdma-loopback"
step "building the library's endpoint example for the guests (examples/host/endpoint.rs)"
cargo build --release -p host-examples --no-default-features --bin endpoint --locked --target-dir target/guest
export SOFTROCE_ENDPOINT_BIN="$PWD/target/guest/release/endpoint"
step "building the CUDA build too, to check in a guest that it runs without a GPU"
cargo build --release -p host --locked
mkdir -p target/guest-cuda
cp target/release/host target/guest-cuda/host-cuda
export SOFTROCE_HOST_CUDA_BIN="$PWD/target/guest-cuda/host-cuda"
step "the PTX kept for stable builds is this build's, byte for byte (tests/kept-ptx.sh)"
bash tests/kept-ptx.sh check
step "a user's crate outside the workspace, on stable Rust, with GPU support (tests/outside-crate.sh)"
bash tests/outside-crate.sh

step "building the NCCL net plugin (nccl-net/, tests/nccl/build-plugin.sh)"
# The harness (nccl-net/tests/harness.rs) dlopens this very .so and drives it as NCCL
# does, a few seconds; without the variable it would build its own copy.
NCCL_GRDMA_PLUGIN="$(bash tests/nccl/build-plugin.sh)"
export NCCL_GRDMA_PLUGIN

step "cargo test"
cargo test --workspace --locked --no-fail-fast

step "the NCCL plugin's harness over RDMA verbs, in a Soft-RoCE guest (tests/nccl/verbs-guest.sh)"
# cargo test ran its verbs_ tests as skips (no RDMA device here); in the guest they run
# over rxe0: sizes, 32 in flight, tags, refusals, repair, checks off, a killed peer (~1 min).
bash tests/nccl/verbs-guest.sh "$NCCL_GRDMA_PLUGIN"

step "the Python module: pip install ./python in a fresh virtual environment, then pytest"
# As a user installs it: maturin (from PyPI, as pyproject.toml's build backend) builds the
# extension; python/tests/ runs over TCP loopback (test_cuda.py skips here: no torch, no
# GPU; it runs on the H200, python/tests/h200-run.sh).
python3 -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }
rm -rf target/python-venv
python3 -m venv target/python-venv
target/python-venv/bin/pip install -q ./python pytest numpy
(cd python && ../target/python-venv/bin/python -m pytest -q -rs -p no:cacheprovider tests)

step "the Python module's tests over RDMA verbs, in a Soft-RoCE guest (python/tests/softroce-run.sh)"
# The same virtual environment's interpreter and packages go into the guest; the tests
# run against its rxe address with transport="rdma" (~3 min).
bash python/tests/softroce-run.sh target/python-venv

step "Miri over the host-memory modules (host buffers, the schedule, the memcpy wire and its thread, wire formats)"
# Miri checks for undefined behaviour as the code runs: use after free, data races
# between the wire's thread and the source, out-of-bounds copies. Only code that makes
# no FFI call can run under it, hence the module list and the build without CUDA.
cargo miri setup
cargo miri test -p host --no-default-features --lib --locked -- \
    memory::host_buffer memory::lent transfer::memcpy_wire transfer::schedule transfer::plan \
    wire::acks wire::answers wire::auth wire::error wire::names wire::offer wire::repair \
    wire::session net::tcp::frames net::joins net::verbs::messages engine::stripe \
    engine::cooldown transfer::cancel

step "fuzzing the wire formats for 30 s (cargo fuzz; everything a peer sends is decoded there)"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --version 0.13.2 --locked
(cd host && cargo fuzz run wire -- -max_total_time=30)
