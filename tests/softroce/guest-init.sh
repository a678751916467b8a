#!/bin/sh
# guest-init.sh - PID 1 of a Soft-RoCE test guest (runs under busybox ash).
#
# setup.sh copies this file to /init in the base initramfs. The kernel runs
# it after unpacking the initramfs. It:
#   1. mounts /proc, /sys, /dev, /tmp, /run, /dev/shm;
#   2. loads the kernel modules listed in /etc/softroce-modules (in order);
#   3. builds the network (see "topology" below) and the rxe device rxe0;
#   4. waits, bounded, until rxe0's port is ACTIVE and has our IPv4 GID
#      (and, with two guests, until the peer answers ping);
#   5. runs /softroce/run.sh (written by run-guest.sh; it runs the user's
#      SCRIPT with /bin/sh) with RXE_ADDR, PEER_ADDR, ROLE, RXE_DEV set;
#   6. prints "@@SOFTROCE-EXIT <rc>@@" and powers the guest off.
# If a step fails it prints "softroce-init: ERROR: ..." and
# "@@SOFTROCE-INIT-FAILED@@", then powers off.
#
# Settings come from the kernel command line (set by run-guest.sh):
#   softroce.topo=one|two   one: veth pair inside this guest, rxe on veth0
#                           two: rxe on eth0 (virtio NIC to the other guest)
#   softroce.role=a|b  softroce.addr=IP  softroce.peer=IP  softroce.mtu=N
#   softroce.peerwait=SECS  how long to wait for the peer's ping (two)

export PATH=/opt/bin:/usr/sbin:/usr/bin
# Busybox ash runs its own applets before anything in PATH, so iproute2's
# tools are called by full path.
IP=/usr/bin/ip
RDMA=/usr/bin/rdma

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel found no /dev/console in the initramfs, so PID 1 started
# without stdin/stdout/stderr: attach them to the console now.
exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

uptime_s() { cut -d' ' -f1 /proc/uptime; }

fail() {
  echo "softroce-init: ERROR: $*"
  echo "@@SOFTROCE-INIT-FAILED@@"
  sleep 0.2          # let the serial line drain before power goes away
  poweroff -f
}

# --- settings from /proc/cmdline -------------------------------------------
TOPO=one ROLE=a ADDR=192.0.2.1 PEER=192.0.2.1 MTU=9000 PEERWAIT=90
read -r CMDLINE < /proc/cmdline
for word in $CMDLINE; do   # word splitting on purpose
  case $word in
    softroce.topo=*) TOPO=${word#*=} ;;
    softroce.role=*) ROLE=${word#*=} ;;
    softroce.addr=*) ADDR=${word#*=} ;;
    softroce.peer=*) PEER=${word#*=} ;;
    softroce.mtu=*) MTU=${word#*=} ;;
    softroce.peerwait=*) PEERWAIT=${word#*=} ;;
  esac
done

# --- kernel modules ---------------------------------------------------------
# Each module costs time under TCG: skip the NIC drivers the topology does
# not use (virtio for one guest, veth for two).
while read -r mod; do
  case $TOPO/$mod in
    one/virtio*|one/*failover) continue ;;
    two/veth) continue ;;
  esac
  insmod "/usr/lib/modules/softroce/$mod.ko" || fail "insmod $mod"
done < /etc/softroce-modules

# --- network ----------------------------------------------------------------
$IP link set lo up
case $TOPO in
  one)
    # A veth pair: rxe sits on veth0 and, since both ends of a connection
    # use veth0's address, rxe loops the packets back internally. veth1
    # only has to be up so that veth0 has carrier.
    NETDEV=veth0
    $IP link add veth0 type veth peer name veth1 || fail "ip link add veth"
    $IP link set veth0 mtu "$MTU" || fail "mtu $MTU on veth0"
    $IP link set veth1 mtu "$MTU" || fail "mtu $MTU on veth1"
    $IP link set veth1 up
    ;;
  two)
    NETDEV=eth0
    i=0
    while [ ! -e /sys/class/net/eth0 ]; do
      i=$((i + 1)); [ $i -le 50 ] || fail "no eth0 after 5 s"
      sleep 0.1
    done
    $IP link set eth0 mtu "$MTU" || echo "softroce-init: warning: cannot set mtu $MTU on eth0"
    ;;
  *) fail "unknown topology '$TOPO'" ;;
esac
$IP link set "$NETDEV" up || fail "ip link set $NETDEV up"

# --- the rxe device ---------------------------------------------------------
$RDMA link add rxe0 type rxe netdev "$NETDEV" || fail "rdma link add rxe0 on $NETDEV"
i=0
until $RDMA link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE'; do
  i=$((i + 1)); [ $i -le 100 ] || fail "rxe0 port not ACTIVE after 10 s"
  sleep 0.1
done

# Add the address after the device exists: rxe adds the matching RoCE v2
# GID (::ffff:a.b.c.d) when it sees the address appear. Wait for that GID,
# because rdma_cm cannot resolve the address before it is there.
$IP addr add "$ADDR/24" dev "$NETDEV" || fail "ip addr add $ADDR"
# shellcheck disable=SC2086  # split the dotted quad into $1..$4 on purpose
GIDTAIL=$(IFS=.; set -- $ADDR; printf 'ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4")
i=0
until cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | grep -q ":$GIDTAIL\$"; do
  i=$((i + 1)); [ $i -le 100 ] || fail "no GID for $ADDR on rxe0 after 10 s"
  sleep 0.1
done

# --- two guests: wait until the other one is up -----------------------------
# The peer adds its address only after its rxe device is ACTIVE (above), so
# an answer to ping means the peer's rxe is ready too.
if [ "$TOPO" = two ]; then
  i=0
  until ping -c 1 -W 1 "$PEER" >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -le "$PEERWAIT" ] || fail "peer $PEER not reachable after ${PEERWAIT} tries"
    sleep 0.2        # ping may fail at once (no ARP answer yet): pace the loop
  done
fi

echo "softroce-init: ready at $(uptime_s)s: topology=$TOPO role=$ROLE addr=$ADDR peer=$PEER netdev=$NETDEV mtu=$(cat "/sys/class/net/$NETDEV/mtu")"

# --- the user's script ------------------------------------------------------
[ -f /softroce/run.sh ] || fail "no /softroce/run.sh in the initramfs"
export RXE_ADDR="$ADDR" PEER_ADDR="$PEER" ROLE RXE_DEV=rxe0 RXE_NETDEV="$NETDEV"
export SOFTROCE_TOPOLOGY="$TOPO" HOME=/root
cd /tmp || fail "cd /tmp"
echo "@@SOFTROCE-START@@"
/bin/sh /softroce/run.sh </dev/null
rc=$?
echo "@@SOFTROCE-EXIT $rc@@"
sleep 0.1            # let the serial line drain before power goes away
poweroff -f
