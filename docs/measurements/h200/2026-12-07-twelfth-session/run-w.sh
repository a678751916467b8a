#!/usr/bin/env bash
# Twelfth session: on an H200 only (the issues' lines name it), the GPU tests, endpoint,
# outside crate, Python module and peers (run-t1.sh), then the plugin's sweep (run-t2.sh).
# On any other card: say which and stop, spending nothing more.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee $OUT/card.txt
case "$name" in
  *H200*) ;;
  *) echo "not an H200 ($name): nothing run"; exit 0;;
esac
start=$SECONDS
mkdir -p $OUT/t1 $OUT/t2
OUT=$OUT/t1 bash target/dev/run-t1.sh 2>&1 | tee $OUT/t1-printed.txt
echo "t1 took $((SECONDS-start)) s"
OUT=$OUT/t2 timeout $((590-(SECONDS-start))) bash target/dev/run-t2.sh 2>&1 | tee $OUT/t2-printed.txt
echo "t1+t2 took $((SECONDS-start)) s"
cd $OUT && tar czf all.tgz t1 t2 && rm -rf t1 t2
