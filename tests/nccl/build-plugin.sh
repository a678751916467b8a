#!/usr/bin/env bash
# Builds the NCCL net plugin and names it as NCCL looks for it:
#
#   tests/nccl/build-plugin.sh            # prints the path of target/plugin/libnccl-net-grdma.so
#
# cargo builds nccl-net/ as libnccl_net_grdma.so (a library name cannot hold a hyphen);
# NCCL_NET_PLUGIN takes a path, or a name it turns into libnccl-net-<name>.so, so the
# copy carries NCCL's spelling. The profile `plugin` (workspace Cargo.toml) unwinds
# panics so the plugin can catch them at its C boundary (release aborts). The script
# also checks the .so needs no glibc newer than 2.35 (Ubuntu 22.04, the H200 machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -p nccl-net --profile plugin --locked >&2
src=target/plugin/libnccl_net_grdma.so
dst=target/plugin/libnccl-net-grdma.so
cp -f "$src" "$dst"
if command -v objdump >/dev/null; then
    newest=$(objdump -T "$dst" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
    if [ "$(printf '%s\nGLIBC_2.35\n' "$newest" | sort -V | tail -1)" != GLIBC_2.35 ]; then
        echo "build-plugin: $dst needs $newest, newer than GLIBC_2.35" >&2
        exit 1
    fi
    for sym in ncclNetPlugin_v11 ncclNetPlugin_v10 ncclNetPlugin_v9 ncclNetPlugin_v8; do
        objdump -T "$dst" | grep -q " $sym\$" || { echo "build-plugin: $sym not exported" >&2; exit 1; }
    done
    echo "build-plugin: $dst (needs up to $newest; exports ncclNetPlugin_v11, v10, v9, v8)" >&2
fi
echo "$PWD/$dst"
