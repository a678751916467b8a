#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian (bookworm) machine,
# then prints the environment to use. Idempotent: a second run takes a second or two.
#
#   eval "$(bash tests/setup-env.sh)"      # installs, then exports CUDA_LIBRARY_PATH etc.
#
# What it installs, and why:
# - the pinned nightly of rust-toolchain.toml (RUSTUP_AUTO_INSTALL=0 here, so nobody else will),
#   with Miri for the soundness checks;
# - rdma-core's headers and libclang (rdma-sys generates its bindings with bindgen);
# - NVIDIA's driver library libcuda.so from Debian's non-free `libcuda1`, unpacked into
#   target/deps/cuda (never installed): only so that `cust` can link. At run time the
#   binary loads the libcuda.so.1 of the machine's own driver;
# - ptxas from the PyPI package nvidia-cuda-nvcc, so CI can assemble the PTX for real GPUs.
# All progress goes to stderr; stdout carries only the `export` lines.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps="$repo/target/deps"
mkdir -p "$deps"
log() { echo "setup-env: $*" >&2; }

# --- Debian packages -------------------------------------------------------------------
packages=(pkg-config libclang-dev libibverbs-dev librdmacm-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

# --- Rust toolchain --------------------------------------------------------------------
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$repo/rust-toolchain.toml")
installed=$(rustup component list --toolchain "$toolchain" --installed 2>/dev/null || true)
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1 \
    || ! grep -q '^llvm-tools' <<<"$installed" || ! grep -q '^miri' <<<"$installed"; then
    log "installing Rust $toolchain"
    # miri: CI runs the host-memory modules under Miri (tests/run-all.sh).
    rustup toolchain install "$toolchain" --profile minimal \
        -c rust-src -c llvm-tools -c rustfmt -c clippy -c miri >&2
fi

# --- libcuda.so for linking (Debian non-free libcuda1, unpacked, not installed) ---------
cuda="$deps/cuda"
if [ ! -e "$cuda/lib64/libcuda.so" ]; then
    log "fetching libcuda1 (link-time only)"
    apt_dir="$deps/apt"
    mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$cuda/lib64"
    # Same mirrors and suites as the machine's own main component, with non-free instead.
    awk 'BEGIN{RS="";ORS="\n\n"} /Components:.*main/ && !/security/ {sub(/Components:[^\n]*/,"Components: non-free"); print}' \
        /etc/apt/sources.list.d/*.sources > "$apt_dir/parts/nonfree.sources"
    apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
        -o "Dir::State::Lists=$apt_dir/lists")
    apt-get "${apt_opts[@]}" update -q >&2
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libcuda1 >&2)
    rm -rf "$apt_dir/root" && dpkg -x "$apt_dir"/libcuda1_*.deb "$apt_dir/root"
    lib=$(find "$apt_dir/root" -name 'libcuda.so.*.*' | head -n1)
    cp "$lib" "$cuda/lib64/"
    ln -sf "$(basename "$lib")" "$cuda/lib64/libcuda.so"
    ln -sf "$(basename "$lib")" "$cuda/lib64/libcuda.so.1"
fi

# --- ptxas (PyPI nvidia-cuda-nvcc) ----------------------------------------------------
nvcc_dir="$deps/nvcc"
if [ ! -x "$(find "$nvcc_dir" -name ptxas -type f 2>/dev/null | head -n1)" ]; then
    log "installing ptxas (nvidia-cuda-nvcc)"
    python3 -m pip install -q --disable-pip-version-check --target "$nvcc_dir" 'nvidia-cuda-nvcc==13.0.*' >&2
fi
ptxas=$(find "$nvcc_dir" -name ptxas -type f | head -n1)
chmod +x "$ptxas"

# cust_raw's build looks for <CUDA_LIBRARY_PATH>/lib64/libcuda.so
echo "export CUDA_LIBRARY_PATH='$cuda'"
echo "export PTXAS='$ptxas'"
# Binaries built with the default `cuda` feature need libcuda.so.1 to start at all. On a
# machine without NVIDIA's driver, let them find the unpacked copy: CUDA then reports
# that there is no GPU and the GPU tests skip with that reason. Where the driver is
# installed, its own library is used and nothing is set.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    echo "export LD_LIBRARY_PATH='$cuda/lib64'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
fi
