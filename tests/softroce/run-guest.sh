#!/usr/bin/env bash
# run-guest.sh - run a shell script inside Soft-RoCE (rdma_rxe) QEMU guest(s).
#
# Usage:
#   run-guest.sh [options] -- SCRIPT [ARG...]
#
# Options:
#   --topology one|two   one (default): a single guest; rxe0 sits on a veth
#                        pair and both ends of a connection use RXE_ADDR
#                        (192.0.2.1); rxe loops the packets internally.
#                        two: guests a (192.0.2.1) and b (192.0.2.2), each
#                        with rxe0 on its own virtio NIC, the NICs joined
#                        on this machine (see --link). Both guests run the
#                        same SCRIPT; it branches on ROLE.
#   --timeout SECS       give up after SECS (default 300): kill QEMU, exit 124.
#   --bin PATH           a project binary, or a directory whose top-level
#                        executable files are taken (not recursive). They go
#                        to /opt/bin (first on PATH), with the shared libraries
#                        ldd lists for them. May be given several times.
#   --tree SRC=DST       copy the directory SRC into the guest at DST (an
#                        absolute path; symbolic links followed, __pycache__
#                        left out), with the shared libraries its ELF files
#                        need, as for --bin. May be repeated. (The Python
#                        tests take an interpreter's library and a virtual
#                        environment's packages this way.)
#   --env NAME=VALUE     export NAME=VALUE to SCRIPT. May be repeated.
#   --mem SIZE           guest RAM, QEMU syntax (default: 3G for one guest,
#                        2G each for two).
#   --smp N              guest CPUs (default: 2 for one guest, 1 each for two).
#   --link stream|udp    (two only) how the two NICs are joined:
#                        stream (default): a Unix stream socket in this run's
#                        private temp dir (QEMU -netdev stream): lossless,
#                        and nothing that concurrent runs could collide on.
#                        udp: QEMU -netdev dgram on a free pair of 127.0.0.1
#                        UDP ports (picked under a lock). Datagrams are lost
#                        when a guest falls behind, so its MTU defaults to
#                        1500 (with 9000, rxe's retransmissions never catch up).
#   --mtu N              MTU of the rxe netdev (default 9000; 1500 for udp).
#   --nics 1|2           (two only, stream link) virtio NICs per guest: with 2,
#                        eth1 of a and eth1 of b are joined by a second Unix
#                        stream socket, a link of their own (a second rail).
#                        The guests only see eth1 appear: SCRIPT configures it
#                        (see scenarios/rails-two.sh).
#   --kill-b-after SECS  (two only) SIGKILL guest b's QEMU SECS seconds after
#                        its SCRIPT started: a receiver host that vanishes.
#   --log-dir DIR        keep the raw console logs here (a.log, b.log, and
#                        QEMU's own messages in a.qemu, b.qemu). Default: a
#                        temporary directory, removed on success and copied
#                        to <tmp>/softroce-run.XXXXXX.logs on failure.
#   --qemu-arg ARG       one more argument for QEMU (both guests), e.g.
#                        --qemu-arg -cpu --qemu-arg max. May be repeated.
#   -q, --quiet          do not copy guest output to stdout.
#
# Inside the guest SCRIPT runs under /bin/sh (busybox ash) as root in /tmp,
# with stdin from /dev/null, ARGs as "$@", and these variables:
#   RXE_ADDR   this guest's IPv4 address (192.0.2.1 or 192.0.2.2)
#   PEER_ADDR  the other guest's address (topology one: same as RXE_ADDR)
#   ROLE       a or b (topology one: a)
#   RXE_DEV    rxe0            RXE_NETDEV  veth0 (one) or eth0 (two)
#   SOFTROCE_TOPOLOGY  one or two
# Busybox's shell prefers its own applets to PATH: call iproute2 as
# /usr/bin/ip (plain `ip` is busybox's); `rdma` is iproute2's.
#
# Output: each guest's console on stdout, every line prefixed "[a] " or
# "[b] "; each guest ends with a line "@@SOFTROCE-EXIT <rc>@@". Messages of
# this script go to stderr, prefixed "run-guest.sh: ".
#
# Exit code:
#   SCRIPT's exit code (two guests: the first non-zero of a, b; if b was
#   killed by --kill-b-after, a's alone);
#   124  a guest gave no result before --timeout;
#   125  a guest failed before or without running SCRIPT (boot, modules,
#        rxe setup, QEMU died);
#   2    bad usage.
# Nothing is left running when this script returns (and QEMU dies with it
# even if this script is killed with SIGKILL).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export SOFTROCE_CACHE=${SOFTROCE_CACHE:-$REPO/target/softroce}
ME=run-guest.sh

usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die_usage() { echo "$ME: $*" >&2; echo "$ME: see $0 --help" >&2; exit 2; }
say() { echo "$ME: $*" >&2; }

# =============================================================================
# Arguments
# =============================================================================
TOPOLOGY=one TIMEOUT=300 MEM="" SMP="" MTU="" LINK=stream NICS=1
KILL_B_AFTER="" LOG_DIR="" QUIET=0
BINS=() TREES=() ENVS=() QEMU_EXTRA=()
need_value() { [[ $# -ge 2 ]] || die_usage "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --topology)     need_value "$@"; TOPOLOGY=$2; shift 2 ;;
    --timeout)      need_value "$@"; TIMEOUT=$2; shift 2 ;;
    --bin)          need_value "$@"; BINS+=("$2"); shift 2 ;;
    --tree)         need_value "$@"; TREES+=("$2"); shift 2 ;;
    --env)          need_value "$@"; ENVS+=("$2"); shift 2 ;;
    --mem)          need_value "$@"; MEM=$2; shift 2 ;;
    --smp)          need_value "$@"; SMP=$2; shift 2 ;;
    --link)         need_value "$@"; LINK=$2; shift 2 ;;
    --mtu)          need_value "$@"; MTU=$2; shift 2 ;;
    --nics)         need_value "$@"; NICS=$2; shift 2 ;;
    --kill-b-after) need_value "$@"; KILL_B_AFTER=$2; shift 2 ;;
    --log-dir)      need_value "$@"; LOG_DIR=$2; shift 2 ;;
    --qemu-arg)     need_value "$@"; QEMU_EXTRA+=("$2"); shift 2 ;;
    -q|--quiet)     QUIET=1; shift ;;
    -h|--help)      usage 0 ;;
    --)             shift; break ;;
    *)              die_usage "unknown option: $1" ;;
  esac
done
[[ $# -ge 1 ]] || die_usage "missing: -- SCRIPT"
SCRIPT=$1; shift
SCRIPT_ARGS=("$@")
[[ -f $SCRIPT ]] || die_usage "no such script: $SCRIPT"
[[ $TOPOLOGY == one || $TOPOLOGY == two ]] || die_usage "--topology must be one or two"
[[ $LINK == stream || $LINK == udp ]] || die_usage "--link must be stream or udp"
[[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || die_usage "--timeout needs whole seconds"
if [[ -z $MTU ]]; then
  if [[ $TOPOLOGY == two && $LINK == udp ]]; then MTU=1500; else MTU=9000; fi
fi
[[ $MTU =~ ^[0-9]+$ ]] || die_usage "--mtu needs a number"
[[ $NICS == 1 || $NICS == 2 ]] || die_usage "--nics must be 1 or 2"
if [[ $NICS == 2 ]]; then
  [[ $TOPOLOGY == two && $LINK == stream ]] || die_usage "--nics 2 needs --topology two (and --link stream)"
fi
if [[ -n $KILL_B_AFTER ]]; then
  [[ $TOPOLOGY == two ]] || die_usage "--kill-b-after needs --topology two"
  [[ $KILL_B_AFTER =~ ^[0-9]+$ ]] || die_usage "--kill-b-after needs whole seconds"
fi
for e in ${ENVS[@]+"${ENVS[@]}"}; do
  [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die_usage "--env wants NAME=VALUE, got: $e"
done
for t in ${TREES[@]+"${TREES[@]}"}; do
  [[ $t == *=/* && -d ${t%%=*} ]] || die_usage "--tree wants SRC=/DST with SRC a directory, got: $t"
done
if [[ $TOPOLOGY == one ]]; then
  GUESTS=(a); MEM=${MEM:-3G}; SMP=${SMP:-2}
else
  GUESTS=(a b); MEM=${MEM:-2G}; SMP=${SMP:-1}
fi

# =============================================================================
# The cached parts (packages, kernel, base initramfs): setup.sh, ~0.5 s warm
# =============================================================================
"$HERE/setup.sh" --quiet >/dev/null
# shellcheck source=/dev/null  # written by setup.sh
. "$SOFTROCE_CACHE/env.sh"

# =============================================================================
# Per-run state, and the cleanup that runs however this script ends
# =============================================================================
# Everything of this run lives in WORK, so concurrent runs share nothing.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/softroce-run.XXXXXX")
KEEP_LOGS=1
if [[ -z $LOG_DIR ]]; then LOG_DIR=$WORK/logs KEEP_LOGS=0; fi
mkdir -p "$LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)

declare -A QPID=()        # QEMU's PID, by guest
FOLLOWERS=()              # PIDs of the tail/sed pairs that copy logs to stdout
PORT_LOCK_FD=""

# stop_pid PID: TERM, wait up to 3 s, then KILL; then reap it quietly (else
# bash reports "Terminated" on stderr). Only for PIDs this script started.
stop_pid() {
  local pid=$1 i
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  { wait "$pid"; } 2>/dev/null || true
}

# keep_logs: on failure, save a temporary log dir from the rm below.
keep_logs() {
  if [[ $KEEP_LOGS == 0 ]]; then
    mkdir -p "$WORK.logs" && cp -a "$LOG_DIR/." "$WORK.logs/"
    say "logs kept in $WORK.logs"
  fi
}

# shellcheck disable=SC2317  # called through the trap
cleanup() {
  local g p
  for g in "${!QPID[@]}"; do stop_pid "${QPID[$g]}"; done
  for p in ${FOLLOWERS[@]+"${FOLLOWERS[@]}"}; do stop_pid "$p"; done
  if [[ -n $PORT_LOCK_FD ]]; then exec {PORT_LOCK_FD}>&-; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# =============================================================================
# The per-run part of the initramfs
# =============================================================================
# Linux accepts several cpio archives glued together (later files win). The
# cached base holds the system; this part holds SCRIPT, a wrapper run.sh
# that runs it with its ARGs and --env variables, and the project's binaries
# with the libraries they need that the base lacks.

# guest_path PATH: the guest has the merged-/usr layout (/lib -> usr/lib...),
# so files are always stored under /usr (same rule as in setup.sh).
guest_path() {
  case $1 in
    /bin/*|/sbin/*|/lib/*|/lib64/*) echo "/usr$1" ;;
    *) echo "$1" ;;
  esac
}
is_elf() { [[ -f $1 && $(head -c 4 "$1" | tr -d '\0') == $'\x7fELF' ]]; }

# sq WORD: WORD in single quotes, safe for any POSIX shell.
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

build_initrd() {
  local root=$WORK/extra f b e a lib dst
  mkdir -p "$root/softroce" "$root/opt/bin"
  cp "$SCRIPT" "$root/softroce/script"
  {
    echo '# written by run-guest.sh'
    for e in ${ENVS[@]+"${ENVS[@]}"}; do
      echo "export ${e%%=*}=$(sq "${e#*=}")"
    done
    printf 'exec /bin/sh /softroce/script'
    for a in ${SCRIPT_ARGS[@]+"${SCRIPT_ARGS[@]}"}; do printf ' %s' "$(sq "$a")"; done
    echo
  } > "$root/softroce/run.sh"

  # The project's binaries: files as given, directories' top-level
  # executables.
  local bins=()
  for b in ${BINS[@]+"${BINS[@]}"}; do
    if [[ -d $b ]]; then
      for f in "$b"/*; do
        if [[ -f $f && -x $f ]]; then bins+=("$f"); fi
      done
    elif [[ -f $b ]]; then
      bins+=("$b")
    else
      die_usage "--bin: no such file or directory: $b"
    fi
  done
  for f in ${bins[@]+"${bins[@]}"}; do
    cp -L --preserve=mode "$f" "$root/opt/bin/"
  done
  # Directory trees, as they are; their ELF files' libraries are looked up as the
  # binaries' are.
  local t elves=()
  for t in ${TREES[@]+"${TREES[@]}"}; do
    mkdir -p "$root${t#*=}"
    (cd "${t%%=*}" && find -L . -name __pycache__ -prune -o -print0 \
       | cpio --null -pdmL --quiet "$root${t#*=}")
    while IFS= read -r -d '' f; do
      if is_elf "$f"; then elves+=("$f"); fi
    done < <(find -L "${t%%=*}" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0)
  done
  # Their shared libraries, unless the base already has them.
  local libs=()
  for f in ${bins[@]+"${bins[@]}"} ${elves[@]+"${elves[@]}"}; do
    is_elf "$f" || continue
    if ldd "$f" 2>/dev/null | grep -q 'not found'; then
      say "warning: $(basename "$f") needs libraries this machine lacks:" \
          "$(ldd "$f" 2>/dev/null | awk '/not found/ { printf "%s ", $1 }')"
    fi
    # "soname path" pairs; the loader itself (a bare path) is its own soname.
    mapfile -t -O "${#libs[@]}" libs < <(ldd "$f" 2>/dev/null | awk '
      $2 == "=>" && $3 ~ /^\// { print $1 " " $3 }
      $1 ~ /^\// { print $1 " " $1 }' || true)
  done
  local soname
  for lib in ${libs[@]+"${libs[@]}"}; do
    soname=${lib%% *} lib=${lib#* }
    case $lib in
      /lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*) dst=$(guest_path "$lib") ;;
      # Found through LD_LIBRARY_PATH somewhere else (e.g. target/deps/cuda): put it
      # where the guest's loader looks, under the name the binary asks for.
      *) dst=/usr/lib/x86_64-linux-gnu/$soname ;;
    esac
    if grep -qxF "$dst" "$SOFTROCE_BASE.files" || [[ -e $root$dst ]]; then continue; fi
    mkdir -p "$root$(dirname "$dst")"
    cp -L --preserve=mode "$lib" "$root$dst"
  done

  # newc cpio, uncompressed (the guest unpacks it faster than it inflates).
  (cd "$root" && find . -print0 | LC_ALL=C sort -z \
     | cpio --null -o -H newc -R 0:0 --quiet) > "$WORK/extra.cpio"
  cat "$SOFTROCE_BASE" "$WORK/extra.cpio" > "$WORK/initrd.cpio"
  rm -rf "$root" "$WORK/extra.cpio"
}

# =============================================================================
# --link udp: a free pair of UDP ports on 127.0.0.1
# =============================================================================
# port_busy PORT: true if some UDP socket on this machine uses PORT.
port_busy() {
  ss -Hnua 2>/dev/null | awk -v p=":$1" '
    substr($4, length($4) - length(p) + 1) == p { found = 1 }
    END { exit !found }'
}

# pick_ports: set PORT_A, PORT_B to a free pair. The caller holds a lock
# until QEMU has bound them, so concurrent runs cannot pick the same pair.
pick_ports() {
  local i
  for ((i = 0; i < 200; i++)); do
    PORT_A=$((20000 + (RANDOM % 20000) * 2)); PORT_B=$((PORT_A + 1))
    if ! port_busy "$PORT_A" && ! port_busy "$PORT_B"; then return 0; fi
  done
  say "no free UDP port pair found"; exit 125
}

# =============================================================================
# Starting a guest
# =============================================================================
# start_guest a|b: start QEMU in the background; its PID goes to QPID[g].
start_guest() {
  local g=$1 addr peer mac netdev
  if [[ $g == a ]]; then addr=192.0.2.1 mac=52:54:00:5e:00:01; else addr=192.0.2.2 mac=52:54:00:5e:00:02; fi
  if [[ $TOPOLOGY == one ]]; then peer=$addr
  elif [[ $g == a ]]; then peer=192.0.2.2
  else peer=192.0.2.1
  fi

  local args=(
    -accel tcg              # KVM guests hang on these machines; TCG works
    -nographic -nodefaults -no-reboot
    -nic none               # never a default (user-mode) network
    -m "$MEM" -smp "$SMP"
    -serial "file:$LOG_DIR/$g.log"
    -kernel "$SOFTROCE_KERNEL"
    -initrd "$WORK/initrd.cpio"
    -append "console=ttyS0 quiet panic=-1 mitigations=off softroce.topo=$TOPOLOGY softroce.role=$g softroce.addr=$addr softroce.peer=$peer softroce.mtu=$MTU"
  )
  # qboot + an uncompressed PVH vmlinux boot ~4 s faster than SeaBIOS +
  # bzImage under TCG (setup.sh decides; empty means QEMU's default).
  if [[ -n ${SOFTROCE_BIOS:-} ]]; then args+=(-bios "$SOFTROCE_BIOS"); fi
  args+=(${QEMU_EXTRA[@]+"${QEMU_EXTRA[@]}"})

  if [[ $TOPOLOGY == two ]]; then
    if [[ $LINK == stream ]]; then
      # a listens on a Unix socket in WORK, b connects to it.
      local server=on
      [[ $g == b ]] && server=off
      netdev="stream,id=n0,server=$server,addr.type=unix,addr.path=$WORK/link.sock"
    else
      local lport=$PORT_A rport=$PORT_B
      [[ $g == b ]] && { lport=$PORT_B rport=$PORT_A; }
      netdev="dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$lport"
      netdev+=",remote.type=inet,remote.host=127.0.0.1,remote.port=$rport"
    fi
    args+=(
      -netdev "$netdev"
      # host_mtu lets the guest use MTU > 1500; romfile= skips the iPXE ROM.
      -device "virtio-net-pci,netdev=n0,mac=$mac,host_mtu=$MTU,romfile="
    )
    if [[ $NICS == 2 ]]; then
      # The second link, like the first: a listens, b connects.
      args+=(
        -netdev "stream,id=n1,server=$server,addr.type=unix,addr.path=$WORK/link2.sock"
        -device "virtio-net-pci,netdev=n1,mac=${mac%:*}:1${mac##*:0},host_mtu=$MTU,romfile="
      )
    fi
  fi

  : > "$LOG_DIR/$g.log"
  # setpriv --pdeathsig: the kernel kills QEMU if this script dies, even by
  # SIGKILL (setpriv execs QEMU, so $! is QEMU's own PID).
  setpriv --pdeathsig KILL qemu-system-x86_64 "${args[@]}" \
    </dev/null >"$LOG_DIR/$g.qemu" 2>&1 &
  QPID[$g]=$!

  if [[ $QUIET == 0 ]]; then
    # Copy the console log to stdout with a prefix, until QEMU is gone:
    # sed reads from a pipe that tail writes into; both PIDs are kept.
    local fd
    exec {fd}> >(exec setpriv --pdeathsig KILL sed -u "s/\r\$//; s/^/[$g] /")
    FOLLOWERS+=("$!")
    setpriv --pdeathsig KILL tail -n +1 -s 0.2 --pid="${QPID[$g]}" -F "$LOG_DIR/$g.log" \
      2>/dev/null 1>&"$fd" &
    FOLLOWERS+=("$!")
    exec {fd}>&-
  fi
}

# =============================================================================
# Main
# =============================================================================
build_initrd
T0=$(date +%s.%N)
if [[ $TOPOLOGY == one ]]; then
  start_guest a
elif [[ $LINK == stream ]]; then
  start_guest a
  # b connects to a's socket, so a must be listening first (bounded wait).
  for ((i = 0; i < 100; i++)); do
    [[ -S $WORK/link.sock ]] && { [[ $NICS == 1 ]] || [[ -S $WORK/link2.sock ]]; } && break
    kill -0 "${QPID[a]}" 2>/dev/null || break
    sleep 0.1
  done
  start_guest b
else
  # One port choice at a time on this machine.
  exec {PORT_LOCK_FD}>/tmp/softroce-udp-ports.lock
  flock -w 60 "$PORT_LOCK_FD" || { say "timed out waiting for the UDP port lock"; exit 125; }
  pick_ports
  start_guest a
  start_guest b
  # Keep the lock until both sockets are bound (or a QEMU died), bounded.
  for ((i = 0; i < 100; i++)); do
    if port_busy "$PORT_A" && port_busy "$PORT_B"; then break; fi
    if ! kill -0 "${QPID[a]}" 2>/dev/null || ! kill -0 "${QPID[b]}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  exec {PORT_LOCK_FD}>&-
  PORT_LOCK_FD=""
fi

# --- watch the guests until each has a result ---------------------------------
# STATE: running, done (RC set), or killed (--kill-b-after).
declare -A RC=() STATE=() START=() WHY=()
for g in "${GUESTS[@]}"; do STATE[$g]=running; done
B_KILLED=0
# Clock in microseconds, without forking (EPOCHREALTIME is bash 5's
# "seconds.micros"; the separator depends on the locale, so drop it).
now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }
DEADLINE=$(($(now_us) + TIMEOUT * 1000000))

while :; do
  running=0
  for g in "${GUESTS[@]}"; do
    [[ ${STATE[$g]} == running ]] || continue
    log=$LOG_DIR/$g.log
    if [[ -z ${START[$g]:-} ]] && grep -aq '@@SOFTROCE-START@@' "$log"; then
      START[$g]=$(now_us)
    fi
    marker=$(grep -aoE '@@SOFTROCE-EXIT [0-9]+@@' "$log" | head -n 1 || true)
    if [[ -n $marker ]]; then
      rc=${marker#@@SOFTROCE-EXIT }
      RC[$g]=${rc%@@}
      STATE[$g]="done"
      continue
    fi
    if grep -aq '@@SOFTROCE-INIT-FAILED@@' "$log"; then
      RC[$g]=125
      STATE[$g]="done"
      WHY[$g]="guest setup failed: $(grep -a 'softroce-init: ERROR' "$log" | head -n 1 | tr -d '\r')"
      continue
    fi
    if ! kill -0 "${QPID[$g]}" 2>/dev/null; then
      RC[$g]=125
      STATE[$g]="done"
      WHY[$g]="QEMU exited without a result: $(tail -n 3 "$LOG_DIR/$g.qemu" | tr '\n' ' ')"
      continue
    fi
    if [[ $g == b && -n $KILL_B_AFTER && -n ${START[b]:-} ]] \
       && (($(now_us) - START[b] >= KILL_B_AFTER * 1000000)); then
      say "killing guest b (QEMU pid ${QPID[b]}) ${KILL_B_AFTER}s after its script started, as asked"
      kill -KILL "${QPID[b]}" 2>/dev/null || true
      # Reap it here, quietly (else bash reports "Killed" on stderr).
      { wait "${QPID[b]}"; } 2>/dev/null || true
      B_KILLED=1
      STATE[b]=killed
      continue
    fi
    running=1
  done
  if [[ $running == 0 ]]; then break; fi
  if (($(now_us) >= DEADLINE)); then
    for g in "${GUESTS[@]}"; do
      if [[ ${STATE[$g]} == running ]]; then
        say "TIMEOUT: guest $g gave no result within ${TIMEOUT}s (console log: $g.log)"
      fi
    done
    keep_logs
    exit 124
  fi
  sleep 0.2
done

# --- all results are in: let the guests power off, then collect ----------------
for g in "${GUESTS[@]}"; do
  for ((i = 0; i < 100; i++)); do
    kill -0 "${QPID[$g]}" 2>/dev/null || break
    sleep 0.1
  done
  stop_pid "${QPID[$g]}"
done
# The followers stop by themselves within ~0.2 s of QEMU's end; give them
# a moment to print the last lines (cleanup stops any that linger).
for p in ${FOLLOWERS[@]+"${FOLLOWERS[@]}"}; do
  for ((i = 0; i < 20; i++)); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
done

# --- the verdict -----------------------------------------------------------------
FINAL=0
for g in "${GUESTS[@]}"; do
  [[ ${STATE[$g]} == killed ]] && continue
  if [[ -n ${WHY[$g]:-} ]]; then say "guest $g: ${WHY[$g]}"; fi
  if [[ ${RC[$g]} != 0 && $FINAL == 0 ]]; then FINAL=${RC[$g]}; fi
done
if [[ -n $KILL_B_AFTER && $B_KILLED == 0 ]]; then
  say "warning: guest b finished before --kill-b-after ${KILL_B_AFTER}s fired"
fi
if [[ $FINAL != 0 ]]; then keep_logs; fi
summary="exit $FINAL after $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')s"
for g in "${GUESTS[@]}"; do summary+=", $g=${RC[$g]:-${STATE[$g]}}"; done
say "$summary"
exit "$FINAL"
