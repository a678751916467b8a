# files.sh - the user's bytes over verbs (issue 17): files of 1 B, 4097 B, 64 MiB and
# 1 GiB + 3 B of random data sent with --input (send and write), received with
# `host recv --output DIR`, compared with sha256sum. Run by tests/tests/softroce.rs
# (topology one, a guest of 6 GiB: the input, both buffers and the output file of the
# largest lie in its memory at once); output format: lib.sh.
. /opt/bin/lib.sh || exit 2
A=$RXE_ADDR

case_files() {
  local size op n=0
  mkdir -p /tmp/out
  start receiver host recv --gpu none --transport rdma --timeout 30 --max-bytes 2GiB --output /tmp/out
  wait_for receiver "receiver: listening" 30
  for size in 1 4097 67108864 1073741827; do
    case $size in
      1|67108864) op=send ;;
      *) op=write ;;
    esac
    # Stored under the sender's name: the input's file name, or --name.
    head -c "$size" /dev/urandom > "/tmp/data-$size.bin"
    val "input_bytes_$size" "$(wc -c < "/tmp/data-$size.bin")"
    if [ "$size" = 4097 ]; then
      run "send_$size" 600 host "$A" 7471 --gpu none --transport rdma --op $op --input "/tmp/data-$size.bin" --name named.bin --timeout 30
    else
      run "send_$size" 600 host "$A" 7471 --gpu none --transport rdma --op $op --input "/tmp/data-$size.bin" --timeout 30
    fi
    n=$((n + 1))
    wait_outcomes receiver $n 60
    val "files_$size" "$(ls /tmp/out | wc -l)"
    echo "@@VAL stored_$size=$(ls /tmp/out)@@"
    val "same_$size" "$([ "$(sha256sum < "/tmp/data-$size.bin")" = "$(cat /tmp/out/* | sha256sum)" ] && echo 1 || echo 0)"
    rm -f "/tmp/data-$size.bin" /tmp/out/*
  done
  stop receiver
}

ALL="files"
for c in ${*:-$ALL}; do
  case_begin "$c"
  "case_$c"
  case_end
done
exit 0
