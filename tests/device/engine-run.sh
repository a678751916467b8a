#!/usr/bin/env bash
# One device run: GPU tests, the library endpoint example, the Python module's CUDA
# tests and its bench against the CLI and NCCL Socket. Logs to $OUT.
# Usage (on the GPU machine, from the repository root): BIN=dir-with-gpu-tests,endpoint,host
#   WHEELS=dir-with-gpu_rdma-and-pytest-wheels OUT=logs tests/device/engine-run.sh
set -u
: "${BIN:?}" "${WHEELS:?}" "${OUT:?}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
nvidia-smi -L
echo "== gpu tests"
timeout 240 "$BIN"/gpu-tests --test-threads 1 > "$OUT/gpu-tests.log" 2>&1; echo "rc=$?"
grep -E "^test result|FAILED|panicked" "$OUT/gpu-tests.log" | head -20
echo "== endpoint example"
timeout 90 "$BIN"/endpoint 100 > "$OUT/endpoint.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/endpoint.log"
echo "== python (CUDA tests, bench)"
WHEELS="$WHEELS" HOST_BIN="$BIN"/host timeout 330 bash python/tests/h200-run.sh > "$OUT/python-run.log" 2>&1; echo "rc=$?"
grep -E "passed|failed|error" "$OUT/python-run.log" | tail -8
cp -r target/python-h200 "$OUT/" 2>/dev/null
tail -40 "$OUT/python-run.log"
