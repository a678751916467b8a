#!/usr/bin/env bash
# Eleventh session, call 3: GPU to GPU against host to host over TCP at 1, 4, 8 streams
# (tests/gpu-tcp-scaling.sh, one round) and host bench tcp against its plain-socket reference.
set -u
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "binaries of $(cat target/dev/commit.txt)"
HOST_BIN=target/dev/host LOG=$OUT/scaling timeout 200 tests/gpu-tcp-scaling.sh 1 > $OUT/scaling.json 2> $OUT/scaling.err; echo "scaling rc=$?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(k, v["gpu_to_gpu"], v["host_to_host"], v["median_ratio"]) for k,v in d["streams"].items()]' $OUT/scaling.json
for s in 1 4 8; do timeout 60 target/dev/host bench tcp --size 1GiB --streams $s --rounds 3 > $OUT/bench-tcp-$s.json 2> $OUT/bench-tcp-$s.err; echo "bench tcp $s rc=$?"; python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["project"]["median_gb_per_s"], d["reference"]["median_gb_per_s"], d["ratio_of_medians"])' $OUT/bench-tcp-$s.json; done
