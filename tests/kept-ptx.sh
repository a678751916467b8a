#!/usr/bin/env bash
# The PTX kept beside the kernels (gpu-kernels/ptx/), which crates built on stable Rust
# embed instead of building it (host/build.rs):
#
#   tests/kept-ptx.sh check    # fails unless the kept PTX is byte for byte this build's (CI)
#   tests/kept-ptx.sh update   # makes it anew from the kernels' sources; commit the result
#
# Both build `host` with the pinned nightly and HOST_PTX=built, and take the PTX and its
# sources' digest from the build script's OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
verb=${1:-check}
out_dir=$(HOST_PTX=built cargo build --release -p host --locked --message-format=json |
    python3 -c '
import json, re, sys
dirs = [m["out_dir"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "build-script-executed"
        and re.search(r"(^host |[/#]host[#@])", m["package_id"])]
print(dirs[-1] if dirs else "")')
[ -n "$out_dir" ] && [ -f "$out_dir/kernels.ptx" ] || {
    echo "kept-ptx: building host did not leave kernels.ptx (run: HOST_PTX=built cargo build --release -p host)" >&2
    exit 1
}
kept=gpu-kernels/ptx
case $verb in
    update)
        mkdir -p "$kept"
        cp "$out_dir/kernels.ptx" "$kept/kernels.ptx"
        cp "$out_dir/kernels.ptx.sources-sha256" "$kept/kernels.ptx.sources-sha256"
        echo "kept-ptx: $kept/kernels.ptx made anew (sources $(cut -c1-12 "$kept/kernels.ptx.sources-sha256"))"
        ;;
    check)
        if cmp -s "$out_dir/kernels.ptx" "$kept/kernels.ptx" &&
            cmp -s "$out_dir/kernels.ptx.sources-sha256" "$kept/kernels.ptx.sources-sha256"; then
            echo "kept-ptx: $kept/kernels.ptx is byte for byte this build's PTX (sources $(cut -c1-12 "$kept/kernels.ptx.sources-sha256"))"
        else
            echo "kept-ptx: FAIL: $kept/kernels.ptx is not what the kernels' sources build to: run tests/kept-ptx.sh update and commit" >&2
            exit 1
        fi
        ;;
    *) echo "usage: tests/kept-ptx.sh check|update" >&2; exit 2 ;;
esac
