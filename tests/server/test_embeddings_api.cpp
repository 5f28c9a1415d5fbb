// /v1/embeddings (server/embeddings_api.h): request parsing and its errors, base64 of float32,
// the response's shape, and serve_embeddings() over the scripted backend (fake_backend.h):
// vectors in input order, usage, dimensions, context limits and truncation, a full queue, a
// timeout and a vanished client (the rest aborted); and over a real engine.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "models/model.h"
#include "models/synth.h"
#include "server/api_error.h"
#include "server/embeddings_api.h"

namespace tern::server {
namespace {

using nlohmann::json;
using tern::testing::FakeBackend;

// Runs fn, which must throw ApiError with this status and param.
template <class Fn>
void expect_api_error(Fn&& fn, int status, const std::string& param, const std::string& code = "") {
  try {
    fn();
    ADD_FAILURE() << "no ApiError (wanted " << status << " " << param << ")";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_EQ(e.param(), param) << e.what();
    if (!code.empty()) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  }
}

std::vector<float> decode_base64_f32(const std::string& b64) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : b64) {
    if (c == '=') break;
    const int v = val(c);
    EXPECT_GE(v, 0) << "not base64: " << c;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += char((acc >> bits) & 0xff);
    }
  }
  EXPECT_EQ(bytes.size() % 4, 0u);
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b) u |= uint32_t(uint8_t(bytes[i * 4 + size_t(b)])) << (8 * b);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

TEST(EmbeddingsParse, TheFourInputShapes) {
  EmbeddingsRequest r = parse_embeddings_request(R"({"input": "hello", "model": "m", "user": "u"})");
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_FALSE(r.inputs[0].is_tokens);
  EXPECT_EQ(r.inputs[0].text, "hello");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.encoding, EmbeddingEncoding::Float);
  r = parse_embeddings_request(R"({"input": ["a", "bc"], "encoding_format": "base64"})");
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[1].text, "bc");
  EXPECT_EQ(r.encoding, EmbeddingEncoding::Base64);
  r = parse_embeddings_request(R"({"input": [1, 2, 3]})");
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_TRUE(r.inputs[0].is_tokens);
  EXPECT_EQ(r.inputs[0].tokens, (std::vector<int64_t>{1, 2, 3}));
  r = parse_embeddings_request(R"({"input": [[1, 2], [3]], "dimensions": 8, "truncate_prompt_tokens": -1})");
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[1].tokens, (std::vector<int64_t>{3}));
  EXPECT_EQ(r.dimensions, 8);
  EXPECT_EQ(r.truncate_prompt_tokens, -1);
  // null means absent (OpenAI's clients send it for unset options).
  r = parse_embeddings_request(R"({"input": "x", "encoding_format": null, "dimensions": null})");
  EXPECT_EQ(r.encoding, EmbeddingEncoding::Float);
  EXPECT_FALSE(r.dimensions);
}

TEST(EmbeddingsParse, BadRequestsNameTheParameter) {
  auto bad = [](const char* body, const std::string& param) {
    expect_api_error([&] { parse_embeddings_request(body); }, 400, param);
  };
  bad(R"({"model": "m"})", "input");
  bad(R"({"input": ""})", "input");
  bad(R"({"input": []})", "input");
  bad(R"({"input": 5})", "input");
  bad(R"({"input": ["a", ""]})", "input[1]");
  bad(R"({"input": ["a", 3]})", "input[1]");
  bad(R"({"input": [[1], "a"]})", "input[1]");
  bad(R"({"input": [[1], []]})", "input[1]");
  bad(R"({"input": [1, -2]})", "input[1]");
  bad(R"({"input": [1, 2.5]})", "input[1]");
  bad(R"({"input": "a", "encoding_format": "int8"})", "encoding_format");
  bad(R"({"input": "a", "encoding_format": 1})", "encoding_format");
  bad(R"({"input": "a", "dimensions": 0})", "dimensions");
  bad(R"({"input": "a", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens");
  bad(R"({"input": "a", "model": 3})", "model");
  bad(R"([1])", "");
  bad(R"({"input": )", "");
  EmbeddingsLimits lim;
  lim.max_inputs = 2;
  expect_api_error([&] { parse_embeddings_request(R"({"input": ["a", "b", "c"]})", lim); }, 400, "input");
}

TEST(EmbeddingsFormat, Base64IsLittleEndianFloat32) {
  // 1.0f = 00 00 80 3f, -2.0f = 00 00 00 c0.
  EXPECT_EQ(embedding_base64(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(embedding_base64(std::vector<float>{}), "");
  const std::vector<float> v = {0.1f, -3.25e-7f, 12345.678f, 0.0f, 1.0f / 3.0f};
  EXPECT_EQ(decode_base64_f32(embedding_base64(v)), v);
  for (size_t n = 1; n <= 4; ++n) {
    const std::vector<float> part(v.begin(), v.begin() + ptrdiff_t(n));
    EXPECT_EQ(embedding_base64(part).size() % 4, 0u);
    EXPECT_EQ(decode_base64_f32(embedding_base64(part)), part);
  }
}

TEST(EmbeddingsFormat, ResponseShape) {
  const json j = embeddings_response({{0.5f, 0.25f}, {1.0f, 0.1f}}, EmbeddingEncoding::Float, "tern-x", 7);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "tern-x");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][1]["embedding"][1].get<float>(), 0.1f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  const json b = embeddings_response({{1.0f, -2.0f}}, EmbeddingEncoding::Base64, "m", 1);
  EXPECT_EQ(b["data"][0]["embedding"], "AACAPwAAAMA=");
}

TEST(ServeEmbeddings, VectorsInInputOrderFloatAndBase64) {
  FakeBackend backend;
  EmbeddingsOptions opt;
  opt.model_name = "tern-test";
  opt.n_embd = 8;
  const std::vector<std::string> texts = {"alpha", "be", "gamma ray"};
  const EmbeddingsResult r = serve_embeddings(R"({"input": ["alpha", "be", "gamma ray"]})", backend, opt);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["data"].size(), 3u);
  int64_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = embedding_tokens(backend.tokenizer(), texts[i]);
    tokens += int64_t(ids.size());
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(j["data"][i]["embedding"].get<std::vector<float>>(), FakeBackend::fake_embedding(ids, 8)) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(r.prompt_tokens, tokens);
  EXPECT_EQ(j["model"], "tern-test");
  // The engine was asked for embeddings, not text.
  EXPECT_TRUE(backend.last_params().embedding.enabled);

  const EmbeddingsResult b =
      serve_embeddings(R"({"input": [[5, 6, 7], [9]], "encoding_format": "base64"})", backend, opt);
  ASSERT_EQ(b.status, 200) << b.body;
  const json jb = json::parse(b.body);
  EXPECT_EQ(decode_base64_f32(jb["data"][0]["embedding"]), FakeBackend::fake_embedding({5, 6, 7}, 8));
  EXPECT_EQ(decode_base64_f32(jb["data"][1]["embedding"]), FakeBackend::fake_embedding({9}, 8));
  EXPECT_EQ(jb["usage"]["total_tokens"], 4);
  EXPECT_TRUE(backend.wait_idle(std::chrono::seconds(5)));
}

TEST(ServeEmbeddings, DimensionsModelAndVocabulary) {
  FakeBackend backend;
  EmbeddingsOptions opt;
  opt.n_embd = 8;
  EXPECT_EQ(serve_embeddings(R"({"input": "a", "dimensions": 8})", backend, opt).status, 200);
  expect_api_error([&] { serve_embeddings(R"({"input": "a", "dimensions": 4})", backend, opt); }, 400, "dimensions");
  // n_embd unknown to the caller: checked against the vectors.
  opt.n_embd = 0;
  expect_api_error([&] { serve_embeddings(R"({"input": "a", "dimensions": 4})", backend, opt); }, 400, "dimensions");
  expect_api_error([&] { serve_embeddings(R"({"input": [[1], [100000]]})", backend, opt); }, 400, "input[1]");
  opt.check_model = [](const std::string& m) {
    if (m != "tern") throw ApiError(404, "invalid_request_error", "model", "model_not_found", "no such model");
  };
  EXPECT_EQ(serve_embeddings(R"({"input": "a", "model": "tern"})", backend, opt).status, 200);
  expect_api_error([&] { serve_embeddings(R"({"input": "a", "model": "other"})", backend, opt); }, 404, "model",
                   "model_not_found");
}

TEST(ServeEmbeddings, ContextLimitAndTruncation) {
  FakeBackend::Options o;
  o.n_ctx = 16;
  FakeBackend backend(o);
  EmbeddingsOptions opt;
  // 16 tokens fit exactly (nothing is generated after an embedding's input).
  std::vector<int> ids16(16, 40);
  EXPECT_EQ(serve_embeddings(json({{"input", ids16}}).dump(), backend, opt).status, 200);
  std::vector<int> ids20;
  for (int i = 0; i < 20; ++i) ids20.push_back(10 + i);
  const std::string two = json({{"input", {std::vector<int>{1, 2}, ids20}}}).dump();
  try {
    serve_embeddings(two, backend, opt);
    ADD_FAILURE() << "no error for an input over the context";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "input[1]");
    EXPECT_EQ(e.code(), "context_length_exceeded");
    const std::string msg = e.what();
    EXPECT_NE(msg.find("input 1 has 20 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16"), std::string::npos) << msg;
  }
  EXPECT_EQ(backend.added(), 1) << "nothing of a refused request may reach the engine";
  // vLLM's truncate_prompt_tokens keeps the last tokens.
  json req = json::parse(two);
  req["truncate_prompt_tokens"] = 5;
  EmbeddingsResult r = serve_embeddings(req.dump(), backend, opt);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["data"][1]["embedding"].get<std::vector<float>>(),
            FakeBackend::fake_embedding({25, 26, 27, 28, 29}, 8));
  EXPECT_EQ(j["data"][0]["embedding"].get<std::vector<float>>(), FakeBackend::fake_embedding({1, 2}, 8));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  req["truncate_prompt_tokens"] = -1;  // the context
  r = serve_embeddings(req.dump(), backend, opt);
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2 + 16);
}

TEST(ServeEmbeddings, FullQueueIs429AndAbortsWhatWasSubmitted) {
  FakeBackend::Options o;
  o.max_waiting = 2;
  o.max_running = 1;
  FakeBackend backend(o);
  backend.pause(true);
  EmbeddingsOptions opt;
  expect_api_error([&] { serve_embeddings(R"({"input": ["a", "b", "c"]})", backend, opt); }, 429, "", "queue_full");
  EXPECT_EQ(backend.aborts(), 2);
  backend.pause(false);
  EXPECT_TRUE(backend.wait_idle(std::chrono::seconds(5)));
}

TEST(ServeEmbeddings, TimeoutAndDisconnectAbortTheRest) {
  FakeBackend backend;
  backend.pause(true);
  EmbeddingsOptions opt;
  opt.timeout = std::chrono::milliseconds(120);
  EmbeddingsResult r = serve_embeddings(R"({"input": ["a", "b"]})", backend, opt);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "timeout");
  EXPECT_EQ(backend.aborts(), 2);
  opt.timeout = std::chrono::seconds(60);
  int polls = 0;
  opt.interrupted = [&polls]() -> const char* { return ++polls > 2 ? "disconnected" : nullptr; };
  r = serve_embeddings(R"({"input": ["a"]})", backend, opt);
  EXPECT_EQ(r.status, 499);
  EXPECT_EQ(backend.aborts(), 3);
  opt.interrupted = []() -> const char* { return "shutdown"; };
  r = serve_embeddings(R"({"input": ["a"]})", backend, opt);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "shutting_down");
  backend.pause(false);
  EXPECT_TRUE(backend.wait_idle(std::chrono::seconds(5)));
}

}  // namespace
}  // namespace tern::server

namespace tern::server {
namespace {

// serve_embeddings over a real engine (a random-weight stories260K-shape model, no ../shared):
// float and base64 answers carry the engine's own vectors, in input order.
TEST(ServeEmbeddings, OverTheRealEngine) {
  const std::string path = ::testing::TempDir() + "tern_embeddings_api_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions so;
  so.shape = "stories260k";
  so.n_threads = 2;
  synth_model(so, path);
  auto file = open_model_file(path);
  std::filesystem::remove(path);  // the mapping keeps the data
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig ec;
  ec.n_threads = 2;
  ec.n_ctx = 128;
  ec.max_batch_tokens = 32;  // the longer inputs are prefilled in chunks
  Engine engine(file, tok, ec);
  engine.start();
  EngineBackend backend(engine);
  EmbeddingsOptions opt;
  opt.n_embd = engine.n_embd();
  const std::vector<std::string> texts = {"Once upon a time there was a fox who liked to run in the woods.", "Lily",
                                          "The sun was warm."};
  const json body = {{"input", texts}};
  const EmbeddingsResult f = serve_embeddings(body.dump(), backend, opt);
  ASSERT_EQ(f.status, 200) << f.body;
  json b64body = body;
  b64body["encoding_format"] = "base64";
  const EmbeddingsResult b = serve_embeddings(b64body.dump(), backend, opt);
  ASSERT_EQ(b.status, 200) << b.body;
  const json jf = json::parse(f.body), jb = json::parse(b.body);
  for (size_t i = 0; i < texts.size(); ++i) {
    // The same request straight to the engine.
    RequestParams p;
    p.prompt_ids = embedding_tokens(*tok, texts[i]);
    p.embedding.enabled = true;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<float> want;
    bool done = false;
    ASSERT_GT(engine.add_request(p, [&](const RequestOutput& o) {
      std::lock_guard lock(mu);
      want = o.embedding;
      done = o.finished;
      cv.notify_all();
    }), 0u);
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
    ASSERT_EQ(int64_t(want.size()), engine.n_embd());
    const std::vector<float> got_f = jf["data"][i]["embedding"].get<std::vector<float>>();
    const std::vector<float> got_b = decode_base64_f32(jb["data"][i]["embedding"]);
    EXPECT_EQ(got_f, got_b) << "float and base64 answers differ, input " << i;
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) worst = std::max(worst, std::fabs(double(got_f[k]) - double(want[k])));
    EXPECT_LT(worst, 1e-6) << "input " << i;
  }
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
  engine.stop();
}

}  // namespace
}  // namespace tern::server
