// Fuzz run of the JSON request parser: mutated valid requests and random bytes must either
// parse or raise ApiError(400) — never crash, hang, or throw anything else. Deterministic
// (fixed seed); TERN_FUZZ_ITERS raises the iteration count for a longer run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/openai_request.h"

using namespace tern::server;

namespace {

const char* kSeeds[] = {
    R"({"model":"m","prompt":"Once upon a time","max_tokens":16,"temperature":0.7,"top_p":0.9,"n":2,"stop":["\n","end"],"seed":1,"logprobs":2,"stream":true,"stream_options":{"include_usage":true},"user":"u"})",
    R"({"model":"m","prompt":[[1,2,3],[4,5]],"echo":true,"top_k":5,"min_p":0.1,"presence_penalty":1,"frequency_penalty":-1})",
    R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null},{"role":"user","content":"q"}],"max_completion_tokens":8,"logprobs":true,"top_logprobs":3})",
    R"({"prompt":["a","b"],"best_of":1,"logit_bias":{},"tools":[],"response_format":{"type":"text"},"suffix":""})",
};

const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "-1", "0", "1e999", "1.5",
                         "\"prompt\"", "\"messages\"", "\"n\"", "\"stop\"", "\"\\u0000\"", "\\", "\xff", "\xc3",
                         "99999999999999999999999", "\"role\"", "\"content\""};

std::string mutate(std::string s, std::mt19937_64& rng) {
  const int n_mut = 1 + int(rng() % 4);
  for (int m = 0; m < n_mut; ++m) {
    const size_t pos = s.empty() ? 0 : size_t(rng() % (s.size() + 1));
    switch (rng() % 6) {
      case 0:  // flip a byte
        if (!s.empty()) s[pos % s.size()] = char(rng() & 0xff);
        break;
      case 1:  // delete a span
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 8);
        break;
      case 2:  // insert a JSON-ish token
        s.insert(pos, kTokens[rng() % std::size(kTokens)]);
        break;
      case 3:  // truncate
        s.resize(pos);
        break;
      case 4: {  // duplicate a span
        if (s.empty()) break;
        const size_t a = pos % s.size(), len = 1 + rng() % 32;
        s.insert(pos, s.substr(a, len));
        break;
      }
      default:  // random bytes
        for (int i = 0, k = int(rng() % 8); i < k; ++i) s.insert(s.begin() + long(pos), char(rng() & 0xff));
        break;
    }
  }
  return s;
}

}  // namespace

TEST(FuzzParser, MutatedRequestsParseOrFailWith400) {
  const char* env = std::getenv("TERN_FUZZ_ITERS");
  const long iters = env ? std::atol(env) : 100000;
  std::mt19937_64 rng(20240607);
  ChatTemplate chatml;
  long accepted = 0, rejected = 0;
  for (long i = 0; i < iters; ++i) {
    std::string body = mutate(kSeeds[rng() % std::size(kSeeds)], rng);
    if (rng() % 4 == 0) body = mutate(body, rng);  // deeper mutations now and then
    const ApiKind kind = rng() % 2 ? ApiKind::Chat : ApiKind::Completion;
    try {
      const OpenAiRequest r = parse_openai_request(body, kind);
      // What the server does next with a parsed request must hold up as well.
      if (kind == ApiKind::Chat) {
        try {
          (void)chatml.apply(r.messages);
        } catch (const ApiError& e) {
          ASSERT_EQ(e.status(), 400);
        }
      }
      r.sampling.validate();
      ++accepted;
    } catch (const ApiError& e) {
      ASSERT_EQ(e.status(), 400) << body;
      ASSERT_FALSE(std::string(e.what()).empty());
      ++rejected;
    }
    // Anything else (std::exception from the JSON library, a tern::Error that is not an
    // ApiError) escapes and fails the test with its message.
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  std::printf("fuzz: %ld bodies, %ld accepted, %ld rejected with 400\n", iters, accepted, rejected);
}

TEST(FuzzParser, RandomBytesAndDeepNesting) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string body(rng() % 64, '\0');
    for (auto& c : body) c = char(rng() & 0xff);
    try {
      parse_openai_request(body, ApiKind::Completion);
    } catch (const ApiError& e) {
      ASSERT_EQ(e.status(), 400);
    }
  }
  // A megabyte of nesting is refused by the pre-scan, without recursion.
  for (const char* open : {"[", "{\"a\":"}) {
    std::string deep;
    for (int i = 0; i < 200000; ++i) deep += open;
    EXPECT_THROW(parse_openai_request(deep, ApiKind::Completion), ApiError);
  }
}
