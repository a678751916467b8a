#!/usr/bin/env bash
# Fetch the two peers' wheels (NIXL and Mooncake's Transfer Engine, both CUDA 13 builds)
# into .whl at the repo root and slim them to what a TCP transfer of CUDA memory loads,
# so that they travel with the working tree (the device machine takes 64 MiB in all).
#
#   python/bench/peers/fetch-wheels.sh            # from the repo root or anywhere in it
#
# Their Python dependencies (torch, numpy for NIXL; aiohttp, requests, msgpack for
# Mooncake) are already on the device machine and are not fetched. Re-running it
# replaces the slimmed wheels. Needs: pip, binutils (strip, readelf), python3.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
NIXL=${NIXL:-nixl-cu13==1.5.1}
MOONCAKE=${MOONCAKE:-mooncake-transfer-engine-cuda13==0.3.14}
grep -q '^/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
command -v strip >/dev/null && command -v readelf >/dev/null || { echo "fetch-wheels: needs strip and readelf (binutils)" >&2; exit 1; }

RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
PLAT=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do PLAT="$PLAT --platform $p"; done
for spec in "$NIXL" "$MOONCAKE"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        $PLAT -d "$RAW" "$spec"
done
mkdir -p .whl
rm -f .whl/nixl_cu13-*.whl .whl/mooncake_transfer_engine_cuda13-*.whl
python3 - "$RAW" .whl <<'PYEOF'
"""Repack each wheel with only the files its TCP transfer path loads.

For each wheel: start from a few roots (the Python package, the extension module, the
plugins or modules it dlopens at run time), add every shared library those need
(DT_NEEDED, resolved by file name among the wheel's own files), drop the rest, strip
the kept ELF files (--strip-unneeded), rewrite RECORD, and zip at level 9.
"""
import base64, fnmatch, glob, hashlib, os, shutil, subprocess, sys, tempfile, zipfile

raw, dest = sys.argv[1], sys.argv[2]

# Roots per wheel (fnmatch patterns on the path inside the wheel).
ROOTS = {
    "nixl_cu13": [
        "nixl_cu13/*.py", "nixl_cu13/py.typed", "nixl_cu13/_bindings.*.so", "nixl_cu13/_utils.*.so",
        # NIXL looks for plugins in <dir of libnixl.so>/plugins: only UCX is used.
        ".nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so",
        # UCX looks for its modules in <dir of libucs>/ucx: CUDA memory (cuda_copy, the
        # CUDA memory hooks) and CMA. TCP, self and shared memory are in libuct itself.
        # Dropped: ib, ib_mlx5*, efa, gdrcopy-less GPU-direct (gda/gdp), perftest modules.
        "nixl_cu13.libs/ucx/libuct_cuda.so*", "nixl_cu13.libs/ucx/libucm_cuda.so*",
        "nixl_cu13.libs/ucx/libuct_cma.so*",
    ],
    "mooncake_transfer_engine_cuda13": [
        "mooncake/__init__.py", "mooncake/py.typed", "mooncake/engine.so", "mooncake/engine.pyi",
    ],
}
# Libraries some ELF needs from the system that an image without RDMA packages or
# libnuma lacks: copied in under the name asked for, from the other wheel's bundled ones
# (auditwheel-renamed, with their own needs beside them). Mooncake's engine.so needs
# libibverbs.so.1, libmlx5.so.1, libnuma.so.1 and libcurl.so.4 to load even when only TCP is used.
BORROW = {
    "mooncake_transfer_engine_cuda13": {
        "mooncake/libibverbs.so.1": "nixl_cu13.libs/libibverbs-*.so*",
        "mooncake/libmlx5.so.1": "nixl_cu13.libs/libmlx5-*.so*",
        "mooncake/libnuma.so.1": "nixl_cu13.libs/libnuma-*.so*",
        "mooncake/libcurl.so.4": "nixl_cu13.libs/libcurl-*.so*",
    },
}

def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]

def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"

def unpack(whl, into):
    with zipfile.ZipFile(whl) as z:
        z.extractall(into)
        return z.namelist()

tmp = tempfile.mkdtemp()
try:
    wheels = {os.path.basename(w).split("-")[0]: w for w in glob.glob(os.path.join(raw, "*.whl"))}
    trees = {}
    for name, whl in wheels.items():
        d = os.path.join(tmp, name)
        trees[name] = (d, unpack(whl, d))
    for name, whl in wheels.items():
        d, names = trees[name]
        files = [n for n in names if not n.endswith("/")]
        by_base = {}
        for n in files:
            by_base.setdefault(os.path.basename(n), n)
        keep = {n for n in files if ".dist-info/" in n and not n.endswith("RECORD") and "/sboms/" not in n}
        todo = [n for n in files if any(fnmatch.fnmatch(n, p) for p in ROOTS[name])]
        for rel, pat in BORROW.get(name, {}).items():
            od, onames = trees["nixl_cu13"]
            src = [n for n in onames if fnmatch.fnmatch(n, pat)]
            assert len(src) == 1, (pat, src)
            shutil.copy2(os.path.join(od, src[0]), os.path.join(d, rel))
            by_base[os.path.basename(rel)] = rel
            # its own needs (renamed libnl and the like) go beside it, by their names
            stack = [src[0]]
            while stack:
                s = stack.pop()
                for lib in needed(os.path.join(od, s)):
                    hit = [n for n in onames if os.path.basename(n) == lib]
                    if hit:
                        tgt = os.path.join(os.path.dirname(rel), lib)
                        if tgt not in keep:
                            shutil.copy2(os.path.join(od, hit[0]), os.path.join(d, tgt))
                            keep.add(tgt); stack.append(hit[0])
            todo.append(rel)
        while todo:
            n = todo.pop()
            if n in keep:
                continue
            keep.add(n)
            p = os.path.join(d, n)
            if is_elf(p):
                for lib in needed(p):
                    if lib in by_base and by_base[lib] not in keep:
                        todo.append(by_base[lib])
        missing = [r for r in ROOTS[name] if not any(fnmatch.fnmatch(n, r) for n in keep)]
        assert not missing, f"{name}: roots not in wheel: {missing}"
        dist_info = next(n.split("/")[0] for n in files if n.split("/")[0].endswith(".dist-info"))
        record = f"{dist_info}/RECORD"
        out = os.path.join(dest, os.path.basename(whl))
        rows = []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
            for n in sorted(keep):
                p = os.path.join(d, n)
                if is_elf(p):
                    subprocess.run(["strip", "--strip-unneeded", p], check=True)
                data = open(p, "rb").read()
                h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                rows.append(f"{n},sha256={h},{len(data)}")
                zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                zi.external_attr = (os.stat(p).st_mode & 0xFFFF) << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(zi, data, compresslevel=9)
            rows.append(f"{record},,")
            z.writestr(zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(rows) + "\n")
        print(f"{os.path.basename(whl)}: {os.path.getsize(whl) >> 20} MiB -> {os.path.getsize(out) / 2**20:.1f} MiB, "
              f"{len(keep)} of {len(files)} files kept", file=sys.stderr)
finally:
    shutil.rmtree(tmp)
PYEOF
du -ch .whl/*.whl
