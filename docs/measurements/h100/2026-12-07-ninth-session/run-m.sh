#!/usr/bin/env bash
# Ninth session: only on an H200 (on anything else: say which GPU and stop, to spare the
# device time). There: everything on a GPU (run-d.sh), the plugin's full sweep (run-e.sh),
# GPU to GPU against host to host (tests/gpu-tcp-scaling.sh, one round) and host bench tcp.
set -u
export NCCL_NVLS_ENABLE=0
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name; binaries of $(cat target/dev/commit.txt)"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
mkdir -p $OUT/d; OUT=$OUT/d bash target/dev/run-d.sh
mkdir -p $OUT/e; OUT=$OUT/e timeout 200 bash target/dev/run-e.sh
mkdir -p $OUT/ns
HOST_BIN=target/dev/host LOG=$OUT/ns/scaling timeout 150 tests/gpu-tcp-scaling.sh 1 > $OUT/ns/scaling.json 2> $OUT/ns/scaling.err; echo "scaling rc=$?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(k, v["gpu_to_gpu"], v["host_to_host"], v["median_ratio"]) for k,v in d["streams"].items()]' $OUT/ns/scaling.json
for s in 1 4 8; do timeout 40 target/dev/host bench tcp --size 1GiB --streams $s --rounds 3 > $OUT/ns/bench-tcp-$s.json 2> $OUT/ns/bench-tcp-$s.err; echo "bench tcp $s rc=$?"; python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["project"]["median_gb_per_s"], d["reference"]["median_gb_per_s"], d["ratio_of_medians"])' $OUT/ns/bench-tcp-$s.json; done
cd $OUT && tar czf all.tgz * --remove-files 2>/dev/null; ls $OUT
