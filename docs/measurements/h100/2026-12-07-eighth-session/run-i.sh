#!/usr/bin/env bash
# Eighth session, call 2 (warm): everything on a GPU (run-d.sh), then GPU to GPU against host to host at 1/4/8 streams (one round).
set -u
bash target/dev/run-d.sh
mkdir -p $OUT/ns
HOST_BIN=target/dev/host LOG=$OUT/ns/scaling timeout 200 tests/gpu-tcp-scaling.sh 1 > $OUT/ns/scaling.json 2> $OUT/ns/scaling.err; echo "scaling rc=$?"
tail -40 $OUT/ns/scaling.json
cd $OUT && tar czf ns.tgz ns && rm -rf ns
