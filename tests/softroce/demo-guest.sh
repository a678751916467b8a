#!/bin/sh
# Runs inside the Soft-RoCE guest for demo.sh: one receiver, one sender, both on rxe0's
# address. Arguments are passed to the sender.
cd /tmp || exit 1

echo "\$ host recv --once &"
host recv --once >recv.log 2>&1 &
receiver=$!

# Wait (at most 10 s) until the receiver listens.
i=0
until grep -q listening recv.log 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt 100 ] || ! kill -0 "$receiver" 2>/dev/null; then
        cat recv.log
        echo "demo: the receiver did not start"
        exit 1
    fi
    sleep 0.1
done

echo "\$ host $RXE_ADDR 7471 $*"
host "$RXE_ADDR" 7471 "$@"
sent=$?

# The receiver exits by itself after one transfer (bounded by its own --timeout).
wait "$receiver"
received=$?
echo
echo "--- the receiver's output (exit $received) ---"
cat recv.log
[ "$sent" = 0 ] && [ "$received" = 0 ]
