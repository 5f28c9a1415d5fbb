#!/usr/bin/env bash
# Coverage-guided fuzz run of the OpenAI request parser, or of the HTTP request parser, with
# libFuzzer + ASan + UBSan:
#   tests/server/fuzz/run_fuzz.sh [SECONDS=60]          (the OpenAI request parser)
#   tests/server/fuzz/run_fuzz.sh SECONDS http          (the HTTP/1.x request parser)
#   tests/server/fuzz/run_fuzz.sh SECONDS jinja         (the Jinja engine on template text)
# Needs clang with libFuzzer (Debian's clang). Not part of CTest (it is open-ended); the
# deterministic FuzzParser.* tests in test_server always run.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
secs="${1:-60}"
out="$root/build/fuzz"
mkdir -p "$out/corpus"
if [ "${2:-}" = http ]; then
  mkdir -p "$out/http_corpus"
  clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/src" \
    "$root/tests/server/fuzz/fuzz_http_parser.cpp" "$root/src/server/http_parser.cpp" \
    "$root/src/server/http_message.cpp" "$root/src/core/error.cpp" -o "$out/fuzz_http_parser"
  # Seeds (first byte: the piece size of the differential feed).
  printf '\3GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n' >"$out/http_corpus/seed1"
  printf '\5POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello' >"$out/http_corpus/seed2"
  printf '\7POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n' >"$out/http_corpus/seed3"
  exec "$out/fuzz_http_parser" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$out/http_corpus"
fi
jinja_srcs=("$root"/src/jinja/*.cpp)
if [ "${2:-}" = jinja ]; then
  mkdir -p "$out/jinja_corpus"
  clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/src" \
    "$root/tests/server/fuzz/fuzz_jinja.cpp" "${jinja_srcs[@]}" "$root/src/core/error.cpp" -o "$out/fuzz_jinja"
  # Seeds: the real chat templates of tests/jinja/templates.
  for f in "$root"/tests/jinja/templates/*.jinja; do cp "$f" "$out/jinja_corpus/"; done
  exec "$out/fuzz_jinja" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 "$out/jinja_corpus"
fi
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/src" \
  "$root/tests/server/fuzz/fuzz_request_parser.cpp" "$root/src/server/openai_request.cpp" \
  "$root/src/server/chat_template.cpp" "${jinja_srcs[@]}" "$root/src/sampling/sampler.cpp" "$root/src/core/error.cpp" \
  -o "$out/fuzz_request_parser"
# Seeds: one valid request of each shape (first byte: 0 completions, 1 chat).
printf '\0{"model":"m","prompt":"Once upon a time","max_tokens":16,"temperature":0.7,"top_p":0.9,"n":2,"stop":["\\n","end"],"seed":1,"logprobs":2,"stream":true,"stream_options":{"include_usage":true},"user":"u"}' >"$out/corpus/seed1"
printf '\0{"prompt":[[1,2,3],[4,5]],"echo":true,"top_k":5,"min_p":0.1,"presence_penalty":1,"frequency_penalty":-1,"best_of":1}' >"$out/corpus/seed2"
printf '\1{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null},{"role":"user","content":"q"}],"max_completion_tokens":8,"logprobs":true,"top_logprobs":3}' >"$out/corpus/seed3"
"$out/fuzz_request_parser" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$out/corpus"
