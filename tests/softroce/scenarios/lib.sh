# lib.sh - helpers for the scenario scripts (busybox ash, inside the guests).
#
# run-guest.sh copies it into the guest with the binaries (`--bin .../lib.sh` puts
# it in /opt/bin); a scenario starts with `. /opt/bin/lib.sh`.
#
# Every case prints one section that tests/tests/softroce.rs parses:
#
#   @@CASE <name> BEGIN@@
#   @@OUT <label> rc=<n> secs=<s> ended=<uptime> [killed=<why>] [attempts=<n>]@@
#   ...that program's stdout and stderr, as it wrote them...
#   @@VAL <key>=<value>@@          a fact or a measurement (uptime marks, counters)
#   @@LEFTOVER <pid> <comm>@@      a process still alive when the case ended
#   @@CASE <name> END rc=<n>@@     n: 0, or 1 if a process had to be killed because it
#                                  outlived its bound, or was left over
#
# Each program runs in the background with its stdout+stderr in a file; its PID is
# kept, and every wait for it is bounded (then SIGKILL, noted as killed=bound).

OUTDIR=/tmp/scenario
mkdir -p "$OUTDIR"

# now_cs: centiseconds since boot (no external program).
now_cs() {
  local up _rest cs
  read -r up _rest < /proc/uptime
  cs=${up%.*}${up#*.}
  while [ "${cs#0}" != "$cs" ]; do cs=${cs#0}; done
  echo "${cs:-0}"
}
# secs CS: centiseconds as seconds with two decimals.
secs() { printf '%d.%02d' $(($1 / 100)) $(($1 % 100)); }
uptime_s() { secs "$(now_cs)"; }

# alive PID: the process exists and is not a zombie (no fork).
alive() {
  local stat state
  [ -r "/proc/$1/stat" ] || return 1
  read -r stat 2>/dev/null < "/proc/$1/stat" || return 1
  state=${stat##*) }
  state=${state%% *}
  [ "$state" != Z ]
}

CASE="" CASE_RC=0 CASE_PIDS="" UNKILLABLE=""

case_begin() {
  CASE=$1 CASE_RC=0 CASE_PIDS=""
  rm -f "$OUTDIR"/*
  echo "@@CASE $CASE BEGIN@@"
}

# case_end: every process the case started must be gone, and no host, rdma_server or
# rdma_client process may be left (whoever started it). Leftovers are noted and killed.
case_end() {
  local p d comm pid
  for p in $CASE_PIDS; do
    if alive "$p"; then
      read -r comm 2>/dev/null < "/proc/$p/comm"
      echo "@@LEFTOVER $p ${comm:-?}@@"
      kill -9 "$p" 2>/dev/null
      CASE_RC=1
    fi
  done
  for d in /proc/[0-9]*; do
    comm=""
    read -r comm 2>/dev/null < "$d/comm" || continue
    case $comm in
      host|rdma_server|rdma_client)
        pid=${d#/proc/}
        case " $UNKILLABLE " in *" $pid "*) continue ;; esac   # its case said so
        if alive "$pid"; then
          echo "@@LEFTOVER $pid $comm@@"
          kill -9 "$pid" 2>/dev/null
          CASE_RC=1
        fi ;;
    esac
  done
  echo "@@CASE $CASE END rc=$CASE_RC@@"
}

val() { echo "@@VAL $1=$2@@"; }
mark() { val "$1" "$(uptime_s)"; }

# start LABEL CMD...: run CMD in the background; output in $OUTDIR/LABEL.
start() {
  local label=$1
  shift
  "$@" > "$OUTDIR/$label" 2>&1 &
  eval "P_$label=$! T_$label=$(now_cs) A_$label=1 K_$label="
  CASE_PIDS="$CASE_PIDS $!"
}

pid_of() { eval "echo \$P_$1"; }

# await LABEL SECS: wait up to SECS for LABEL to exit by itself, else SIGKILL it.
# Sets R_LABEL (exit code) and E_LABEL (uptime in cs when it was seen gone).
await() {
  local label=$1 bound=$(($2 * 100)) pid t0
  pid=$(pid_of "$label")
  eval "t0=\$T_$label"
  while alive "$pid"; do
    if [ $(($(now_cs) - t0)) -ge "$bound" ]; then
      kill -9 "$pid" 2>/dev/null
      eval "K_$label=bound"
      CASE_RC=1
      break
    fi
    sleep 0.1
  done
  reap "$label"
}

# reap LABEL: collect LABEL's exit code once it is gone (it exited, or was sent SIGKILL).
# A process that SIGKILL cannot end within REAP_BOUND seconds is stuck in the kernel
# (seen: the RDMA CM waiting for ever to destroy a CM id, cm_destroy_id_wait_timeout):
# `wait` would block as long, so it is left there, noted as killed=unkillable (rc 137),
# and the case goes on; the suite tells such a kernel's runs by its console line.
REAP_BOUND=30
reap() {
  local label=$1 pid rc
  pid=$(pid_of "$label")
  if ! gone_within "$pid" "$REAP_BOUND"; then
    eval "K_$label=unkillable R_$label=137 E_$label=$(now_cs)"
    UNKILLABLE="$UNKILLABLE $pid"
    CASE_RC=1
    return
  fi
  wait "$pid" 2>/dev/null   # (no "Killed" notice from the shell in the section)
  rc=$?
  eval "R_$label=$rc E_$label=$(now_cs)"
}

# gone_within PID SECS: wait up to SECS for PID to be gone; 1 if it is still there.
gone_within() {
  local t0
  t0=$(now_cs)
  while alive "$1"; do
    [ $(($(now_cs) - t0)) -ge $(($2 * 100)) ] && return 1
    sleep 0.1
  done
}

# show LABEL: print LABEL's section (header and output).
show() {
  local label=$1 t0 e rc k a
  eval "t0=\$T_$label e=\$E_$label rc=\$R_$label k=\$K_$label a=\$A_$label"
  echo "@@OUT $label rc=$rc secs=$(secs $((e - t0))) ended=$(secs "$e")${k:+ killed=$k} attempts=$a@@"
  cat "$OUTDIR/$label"
}

# finish LABEL SECS: await, then show.
finish() { await "$1" "$2"; show "$1"; }

# run LABEL SECS CMD...: start, then finish.
run() {
  local label=$1 bound=$2
  shift 2
  start "$label" "$@"
  finish "$label" "$bound"
}

# kill_now LABEL SIGNAL: send SIGNAL to LABEL, noted as killed=test.
kill_now() {
  eval "K_$1=test"
  kill "-$2" "$(pid_of "$1")" 2>/dev/null
}

# stop LABEL: SIGTERM (a receiver that serves forever), then finish within 10 s of the
# signal (however long it ran before); still alive then, it is killed (killed=bound).
stop() {
  local pid
  kill_now "$1" TERM
  pid=$(pid_of "$1")
  if ! gone_within "$pid" 10; then
    kill -9 "$pid" 2>/dev/null
    eval "K_$1=bound"
    CASE_RC=1
  fi
  reap "$1"
  show "$1"
}

# wait_for LABEL TEXT SECS: until LABEL's output contains TEXT (fixed string); 1 on timeout.
wait_for() {
  local label=$1 text=$2 bound=$(($3 * 100)) t0
  t0=$(now_cs)
  until grep -qF -- "$text" "$OUTDIR/$label" 2>/dev/null; do
    if [ $(($(now_cs) - t0)) -ge "$bound" ]; then
      val "wait_for_$label" "timeout"
      return 1
    fi
    sleep 0.1
  done
}

# outcomes LABEL: how many transfers a receiver has concluded (each ends in one line:
# `received ...`, `receiver: rejected ...` or `error: ...`).
outcomes() { grep -cE '^(received |receiver: rejected |error: )' "$OUTDIR/$1" 2>/dev/null; }

# wait_outcomes LABEL N SECS: until receiver LABEL has concluded N transfers.
wait_outcomes() {
  local bound=$(($3 * 100)) t0 n
  t0=$(now_cs)
  while :; do
    n=$(outcomes "$1")
    [ "${n:-0}" -ge "$2" ] && return 0
    if [ $(($(now_cs) - t0)) -ge "$bound" ]; then
      val "wait_outcomes_$1" "timeout after ${n:-0} of $2"
      return 1
    fi
    sleep 0.1
  done
}

# send_retry LABEL SECS CMD...: run a sender (foreground) until it finds a receiver:
# an attempt that ends in "no receiver at ... (connection refused)" is repeated, for up
# to SECS in all. The section shows the last attempt and how many there were.
send_retry() {
  local label=$1 bound=$2 t0 n=0
  shift 2
  t0=$(now_cs)
  while :; do
    n=$((n + 1))
    start "$label" "$@"
    eval "T_$label=$t0"   # the bound and secs= count from the first attempt
    await "$label" "$bound"
    eval "A_$label=$n"
    if [ "$(eval "echo \$R_$label")" != 0 ] \
       && grep -q '^error: no receiver at .*(connection refused)$' "$OUTDIR/$label" \
       && [ $(($(now_cs) - t0)) -lt $((bound * 100)) ]; then
      sleep 0.3
      continue
    fi
    break
  done
  show "$label"
}

# Receive completions on rxe0 (this guest's receivers, all queue pairs).
RECVS=/sys/class/infiniband/rxe0/ports/1/hw_counters/rdma_recvs
recvs() { local n; read -r n < "$RECVS"; echo "$n"; }

# wait_data BASE N SECS: until rxe0 counted N more receive completions than BASE
# (with 1 MiB chunks: N MiB of a transfer have landed). 1 on timeout.
wait_data() {
  local bound=$(($3 * 100)) t0
  t0=$(now_cs)
  while [ $(($(recvs) - $1)) -lt "$2" ]; do
    if [ $(($(now_cs) - t0)) -ge "$bound" ]; then
      val wait_data timeout
      return 1
    fi
    sleep 0.05
  done
}
