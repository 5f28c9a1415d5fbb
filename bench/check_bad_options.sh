#!/usr/bin/env bash
# bench_matmul refuses malformed options with exit 2 and a message, before any benchmark runs.
set -u
bin=$1
fail=0
expect() {  # expect MESSAGE ARGS...: exit 2, MESSAGE on stderr
  local want=$1
  shift
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne 2 || $err != *"$want"* ]]; then
    echo "bench_matmul $*: exit $rc, stderr: $err (want exit 2 and \"$want\")"
    fail=1
  fi
}
shape_msg="--shape N_IN,N_OUT: N_IN a positive multiple of 32, N_OUT of 16"
expect "$shape_msg" --shape 100,64        # n_in not a multiple of 32
expect "$shape_msg" --shape 2048,20       # n_out not a multiple of 16
expect "$shape_msg" --shape 2048          # one number
expect "$shape_msg" --shape 2048,64,64    # three
expect "$shape_msg" --shape 0,64
expect "$shape_msg" --shape -64,64
expect "$shape_msg" --shape 64x,64        # not a whole number
expect "$shape_msg" --shape ,64
expect "needs a value" --types q8_0 --shape
expect "unknown option" --bogus 1
exit $fail
