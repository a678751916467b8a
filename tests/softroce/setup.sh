#!/usr/bin/env bash
# setup.sh - prepare the Soft-RoCE (rdma_rxe) QEMU test bed.
#
# What it does, in order (each step is skipped when its result is already
# in the cache, so a second run takes about a second):
#   1. installs the Debian packages the test bed needs (apt-get; root only);
#   2. downloads Debian's own kernel package (the one linux-image-amd64
#      depends on), unpacks it with `dpkg -x` into the cache and runs depmod.
#      The kernel is NEVER installed on this machine: it only boots inside
#      QEMU guests;
#   3. builds the "base" initramfs: busybox, iproute2, rdma-core userspace,
#      perftest, rdmacm-utils, every shared library they need, the kernel
#      modules for rxe, and our guest /init (guest-init.sh).
#
# Cache directory: $SOFTROCE_CACHE, default <repo>/target/softroce.
# Output: the kernel version on stdout, and <cache>/env.sh, which
# run-guest.sh sources to learn the paths.
#
# Usage: setup.sh [--quiet]
#   --quiet   print only the kernel version (progress goes nowhere)

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${SOFTROCE_CACHE:-$REPO/target/softroce}

QUIET=0
case "${1:-}" in
  --quiet) QUIET=1 ;;
  "") ;;
  -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown argument: $1" >&2; exit 2 ;;
esac

# log MESSAGE... : progress messages go to stderr (stdout is the version).
log() { if [[ $QUIET == 0 ]]; then echo "softroce-setup: $*" >&2; fi; }
die() { echo "softroce-setup: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------
# Host side: qemu, cpio, kmod (depmod/modprobe), util-linux (flock),
# iproute2 (ss), binutils (readelf). Guest side (copied from this machine into the initramfs):
# busybox-static and the RDMA userspace.
PKGS=(
  qemu-system-x86 busybox-static cpio kmod util-linux iproute2 xz-utils zstd
  binutils
  rdmacm-utils perftest ibverbs-providers ibverbs-utils libibverbs1
  librdmacm1 libibumad3 libgcc-s1
)

APT_UPDATED=0
apt_update_once() {
  if [[ $APT_UPDATED == 0 ]]; then
    log "apt-get update"
    apt-get update -qq >&2
    APT_UPDATED=1
  fi
}

install_missing_packages() {
  local missing=() p status
  for p in "${PKGS[@]}"; do
    # db:Status-Abbrev is "ii " for an installed package.
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $status == ii* ]] || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ $(id -u) == 0 ]] || die "missing packages (run as root or install them): ${missing[*]}"
  apt_update_once
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
}

# ---------------------------------------------------------------------------
# 2. The guest kernel (downloaded, unpacked, never installed)
# ---------------------------------------------------------------------------
KDIR=$CACHE/kernel        # holds root/ (the unpacked package) and version
KROOT=$KDIR/root

fetch_kernel() {
  if [[ -s $KDIR/version ]]; then
    KVER=$(cat "$KDIR/version")
    if [[ -f $KROOT/boot/vmlinuz-$KVER && -f $KROOT/lib/modules/$KVER/modules.dep ]]; then
      return 0
    fi
  fi
  [[ $(id -u) == 0 ]] || die "need root once to download the kernel package"

  # Which versioned image does the meta package point at today?
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
  if [[ -z $pkg ]]; then
    apt_update_once
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null \
          | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
  fi
  [[ -n $pkg ]] || die "cannot tell which kernel linux-image-amd64 depends on"
  KVER=${pkg#linux-image-}

  log "downloading $pkg (not installing it)"
  rm -rf "$KDIR"
  mkdir -p "$KDIR/dl"
  # apt-get download saves the .deb in the current directory. As root it
  # would warn that the _apt sandbox user cannot write here; run unsandboxed.
  # A stale package list may name a file the archive no longer has: then
  # refresh the lists once and try again.
  if ! (cd "$KDIR/dl" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2); then
    apt_update_once
    (cd "$KDIR/dl" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2)
  fi
  local deb
  deb=$(find "$KDIR/dl" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
  [[ -n $deb ]] || die "apt-get download $pkg produced no .deb"

  log "unpacking $(basename "$deb")"
  dpkg -x "$deb" "$KROOT"
  rm -rf "$KDIR/dl"
  # Debian modules live in /lib/modules (or /usr/lib/modules on merged-usr
  # packages); depmod -b wants <root>/lib/modules.
  if [[ ! -d $KROOT/lib/modules/$KVER && -d $KROOT/usr/lib/modules/$KVER ]]; then
    mkdir -p "$KROOT/lib"
    ln -s ../usr/lib/modules "$KROOT/lib/modules"
  fi
  [[ -f $KROOT/boot/vmlinuz-$KVER ]] || die "no boot/vmlinuz-$KVER in $deb"
  # The package ships no modules.dep: build it for this root only.
  depmod -b "$KROOT" "$KVER"
  echo "$KVER" > "$KDIR/version"     # written last: marks the cache complete
}

# extract_vmlinux: decompress the kernel image once, here, into a plain ELF
# "vmlinux". QEMU boots such an ELF directly (PVH entry point), which skips
# the in-guest decompression of the bzImage: under TCG that alone took ~4 s
# of every boot. If this fails the guests boot the bzImage, only slower.
extract_vmlinux() {
  local img=$KROOT/boot/vmlinuz-$KVER out=$KDIR/vmlinux-$KVER off
  [[ -s $out ]] && return 0
  log "extracting vmlinux from the bzImage"
  # The compressed kernel sits inside the bzImage; find it by its magic.
  local magic cmd
  for magic in '\xfd7zXZ\x00:xz -dc' '\x28\xb5\x2f\xfd:zstd -qdc' '\x1f\x8b\x08:gzip -dc'; do
    cmd=${magic#*:}
    off=$(LC_ALL=C grep -obUaP "${magic%%:*}" "$img" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
    [[ -n $off ]] || continue
    # Trailing bytes after the stream make the decompressor complain: ignore,
    # and judge by the result instead.
    tail -c +"$((off + 1))" "$img" | $cmd > "$out.tmp" 2>/dev/null || true
    if is_elf "$out.tmp" && readelf -n "$out.tmp" 2>/dev/null | grep -q '(0x00000012)'; then
      mv "$out.tmp" "$out"
      return 0
    fi
  done
  rm -f "$out.tmp"
  log "warning: no PVH-bootable vmlinux found; guests will boot the bzImage (slower)"
}

# ---------------------------------------------------------------------------
# 3. The base initramfs
# ---------------------------------------------------------------------------
# Kernel modules the guest loads (their dependencies are found by modprobe).
# crc32_generic is not in modules.dep for rxe, but rxe's ICRC needs a
# "crc32" crypto driver; without it `rdma link add` says "failed to add".
MODULES_REQUIRED=(crc32_generic rdma_rxe rdma_ucm ib_uverbs veth virtio_net)
MODULES_OPTIONAL=(ib_umad virtio_pci)

# Programs copied into the guest (their shared libraries follow via ldd).
guest_programs() {
  local p
  for p in iproute2 ibverbs-utils rdmacm-utils perftest; do
    dpkg -L "$p"
  done | grep -E '^/(usr/)?s?bin/[^/]+$' | sort -u
  # rxe's userspace provider is dlopen'ed by libibverbs, and glibc loads
  # libgcc_s when a thread exits (rping aborted without it).
  echo /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
  echo /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
}

# guest_path PATH: where a host file goes in the guest. The guest uses the
# merged-/usr layout (/bin, /sbin, /lib, /lib64 are links into /usr), so
# every file is stored under /usr and no top-level directory is ever
# replaced by a real one.
guest_path() {
  case $1 in
    /bin/*|/sbin/*|/lib/*|/lib64/*) echo "/usr$1" ;;
    *) echo "$1" ;;
  esac
}

# is_elf FILE: true for ELF binaries (scripts are copied but get no ldd).
is_elf() { [[ -f $1 && $(head -c 4 "$1" | tr -d '\0') == $'\x7fELF' ]]; }

# shared_libs FILE...: the libraries the dynamic loader would map for each
# file, as absolute host paths (one per line, unsorted).
shared_libs() {
  local f
  for f in "$@"; do
    is_elf "$f" || continue
    # "libx.so.1 => /lib/.../libx.so.1 (0x...)" or "/lib64/ld-linux... (0x...)"
    ldd "$f" 2>/dev/null | awk '
      $2 == "=>" && $3 ~ /^\// { print $3 }
      $1 ~ /^\// { print $1 }' || true
  done
}

# copy_in ROOT SRC: copy SRC (dereferenced) to its guest path under ROOT.
copy_in() {
  local dst
  dst=$1$(guest_path "$2")
  mkdir -p "$(dirname "$dst")"
  rm -f "$dst"
  cp -L --preserve=mode "$2" "$dst"
}

# module_load_order: print "insmod <path>" targets for all wanted modules,
# dependencies first, each once.
module_load_order() {
  local m line out
  for m in "${MODULES_REQUIRED[@]}" "${MODULES_OPTIONAL[@]}"; do
    if ! out=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null); then
      if [[ " ${MODULES_REQUIRED[*]} " == *" $m "* ]]; then
        die "kernel $KVER has no module $m"
      fi
      continue
    fi
    # Lines are "insmod /path/x.ko[.xz]" or "builtin x" (nothing to load).
    while read -r line; do
      [[ $line == insmod\ * ]] && echo "${line#insmod }" | awk '{print $1}'
    done <<< "$out"
  done | awk '!seen[$0]++'
}

build_base() {
  local stamp want_stamp out="$CACHE/base-$KVER.cpio"
  # The stamp changes when this script, the guest init, the kernel or any
  # copied package changes; then the base is rebuilt.
  want_stamp=$({
    cat "$HERE/setup.sh" "$HERE/guest-init.sh"
    echo "$KVER"
    dpkg-query -W -f='${Package} ${Version}\n' "${PKGS[@]}" 2>/dev/null
  } | sha256sum | cut -d' ' -f1)
  stamp=$(cat "$out.stamp" 2>/dev/null || true)
  if [[ -f $out && $stamp == "$want_stamp" ]]; then
    return 0
  fi

  log "building base initramfs for $KVER"
  local root
  root=$(mktemp -d "$CACHE/base.XXXXXX")
  # shellcheck disable=SC2064  # expand $root now, on purpose
  trap "rm -rf '$root'" EXIT

  # Directory skeleton, merged-/usr style.
  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,proc,sys,dev,tmp,run,etc,opt/bin,softroce,root}
  ln -s usr/bin "$root/bin"
  ln -s usr/sbin "$root/sbin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"

  # Programs and every library they (and the rxe provider) need.
  local files=() f
  mapfile -t files < <(guest_programs)
  for f in "${files[@]}"; do copy_in "$root" "$f"; done
  while read -r f; do
    copy_in "$root" "$f"
  done < <(shared_libs "${files[@]}" | sort -u)

  # libibverbs reads /etc/libibverbs.d/*.driver to know which providers to
  # try. Only rxe: fewer dlopen()s, and no other provider is of use here.
  mkdir -p "$root/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"

  # A few files programs expect.
  echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
  echo 'root:x:0:' > "$root/etc/group"
  printf '127.0.0.1 localhost\n192.0.2.1 a\n192.0.2.2 b\n' > "$root/etc/hosts"

  # Busybox (static) provides the shell and the small tools. An applet link
  # is made only where no real program was copied (iproute2's ip wins).
  copy_in "$root" /bin/busybox
  local applet
  while read -r applet; do
    f=$root$(guest_path "/$applet")
    if [[ ! -e $f && ! -L $f ]]; then
      mkdir -p "$(dirname "$f")"
      ln -s /usr/bin/busybox "$f"
    fi
  done < <(/bin/busybox --list-full)

  # Kernel modules, uncompressed (busybox insmod cannot read .xz/.zst),
  # plus the load order for /init.
  mkdir -p "$root/lib/modules/softroce"
  local ko name
  : > "$root/etc/softroce-modules"
  while read -r ko; do
    name=$(basename "$ko")
    name=${name%.xz}; name=${name%.zst}; name=${name%.gz}
    case $ko in
      *.xz)  xz -dc "$ko" ;;
      *.zst) zstd -qdc "$ko" ;;
      *.gz)  gzip -dc "$ko" ;;
      *)     cat "$ko" ;;
    esac > "$root/usr/lib/modules/softroce/$name"
    echo "${name%.ko}" >> "$root/etc/softroce-modules"
  done < <(module_load_order)

  # Our PID 1.
  cp "$HERE/guest-init.sh" "$root/init"
  chmod 755 "$root/init"

  # A list of what the base holds: run-guest.sh skips those libraries when
  # it adds the project's binaries.
  (cd "$root" && find . ! -type d | sed 's|^\.||' | sort) > "$out.files.tmp"

  # newc is the cpio format the kernel understands. Uncompressed on purpose:
  # under TCG, decompressing in the guest costs more than it saves.
  (cd "$root" && find . -print0 | LC_ALL=C sort -z \
     | cpio --null -o -H newc -R 0:0 --quiet) > "$out.tmp"
  mv "$out.files.tmp" "$out.files"
  mv "$out.tmp" "$out"
  echo "$want_stamp" > "$out.stamp"
  rm -rf "$root"
  trap - EXIT
  log "base initramfs: $out ($(du -h "$out" | cut -f1))"
}

# ---------------------------------------------------------------------------
main() {
  mkdir -p "$CACHE"
  # One setup at a time per cache (several run-guest.sh may start together).
  exec {lock}>"$CACHE/.setup.lock"
  flock -w 1200 "$lock" || die "timed out waiting for $CACHE/.setup.lock"

  install_missing_packages
  fetch_kernel
  extract_vmlinux
  build_base

  # For run-guest.sh: where things are (written atomically).
  # With a PVH vmlinux, qboot (a minimal firmware shipped with QEMU) starts
  # the guest faster than SeaBIOS; an empty SOFTROCE_BIOS means QEMU's default.
  local kernel=$KROOT/boot/vmlinuz-$KVER bios=""
  if [[ -s $KDIR/vmlinux-$KVER ]]; then
    kernel=$KDIR/vmlinux-$KVER
    [[ -f /usr/share/qemu/qboot.rom ]] && bios=/usr/share/qemu/qboot.rom
  fi
  cat > "$CACHE/env.sh.tmp" <<EOF
SOFTROCE_KVER=$KVER
SOFTROCE_KERNEL=$kernel
SOFTROCE_BIOS=$bios
SOFTROCE_BASE=$CACHE/base-$KVER.cpio
EOF
  mv "$CACHE/env.sh.tmp" "$CACHE/env.sh"
  echo "$KVER"
}

main
