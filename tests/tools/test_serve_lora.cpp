// Multi-LoRA serving over HTTP (tern serve -m BASE --lora NAME=FILE, in-process: the real Engine,
// SingleModelProvider and Server): the request's "model" selects the adapter (vLLM's
// convention), /v1/models lists the adapters with their base, a concurrent mix over four
// adapters and the base gives every request the text it gets alone, adapters load and unload
// at run time (unloading waits for a stream that uses it), and bad requests are clear errors.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "engine/engine.h"
#include "models/lora.h"
#include "models/synth.h"
#include "server/backend.h"
#include "server/model_provider.h"
#include "server/server.h"
#include "lora_fixture.h"
#include "test_util.h"

namespace tern {
namespace {

using json = nlohmann::json;

using tern::testing::write_random_adapter;

class ServeLora : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_serve_lora");
    tern::testing::synth_base_and_other(dir_ + "/base.gguf", dir_ + "/other.gguf");
    const GgufFile base = GgufFile::open(dir_ + "/base.gguf");
    for (int a = 0; a < 5; ++a) write_random_adapter(base, adapter_path(a), int64_t(2) << (a % 4), 40u + uint32_t(a));
    write_random_adapter(GgufFile::open(dir_ + "/other.gguf"), dir_ + "/other-adapter.gguf", 2, 9);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string adapter_path(int a) { return dir_ + "/adapter" + std::to_string(a) + ".gguf"; }

  void start(bool allow_updates) {
    file_ = open_model_file(dir_ + "/base.gguf");
    tok_ = Tokenizer::from_gguf(*file_);
    EngineConfig ecfg;
    ecfg.n_threads = 2;
    ecfg.n_ctx = 128;
    ecfg.n_parallel = 24;
    ecfg.max_batch_tokens = 64;
    engine_ = std::make_unique<Engine>(file_, tok_, ecfg);
    backend_ = std::make_unique<server::EngineBackend>(*engine_);
    auto served = std::make_shared<server::ServedModel>();
    served->id = "base";
    served->backend = backend_.get();
    served->structured = std::make_shared<server::StructuredOutput>(*tok_);
    served->entry.name = "base";
    provider_ = std::make_unique<server::SingleModelProvider>(served, std::vector<std::string>{}, false);
    provider_->enable_adapters([this](const LoraAdapter& a) { engine_->check_lora(a); });
    for (int a = 0; a < 4; ++a) provider_->add_adapter(std::string("a").append(std::to_string(a)), LoraAdapter::load(adapter_path(a)), 1.0f);
    server::ServerConfig c;
    c.port = 0;
    c.http_threads = 48;
    c.max_in_flight = 40;
    c.allow_lora_updates = allow_updates;
    server_ = std::make_unique<server::Server>(*provider_, c);
    server_->start();
    engine_->start();
  }
  void TearDown() override {
    if (server_) server_->shutdown(std::chrono::milliseconds(0));
    if (engine_) engine_->stop();
    server_.reset();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  // Greedy completion text of `prompt` on `model`.
  std::string complete(const std::string& model, const std::string& prompt, int max_tokens = 12) const {
    auto c = client();
    const json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                       {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return "(no answer)";
    EXPECT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["model"], model);
    return j["choices"][0]["text"].get<std::string>();
  }
  httplib::Result post(const std::string& path, const json& body) const {
    auto c = client();
    return c.Post(path, body.dump(), "application/json");
  }

  static std::string dir_;
  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::EngineBackend> backend_;
  std::unique_ptr<server::SingleModelProvider> provider_;
  std::unique_ptr<server::Server> server_;
};
std::string ServeLora::dir_;

TEST_F(ServeLora, ModelsListTheAdaptersWithTheirBase) {
  start(false);
  auto c = client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  ASSERT_EQ(j["data"].size(), 5u);
  EXPECT_EQ(j["data"][0]["id"], "base");
  EXPECT_FALSE(j["data"][0].contains("parent"));
  for (int a = 0; a < 4; ++a) {
    const json& m = j["data"][size_t(a + 1)];
    EXPECT_EQ(m["id"], std::string("a").append(std::to_string(a)));
    EXPECT_EQ(m["parent"], "base");
    EXPECT_EQ(m["root"], adapter_path(a));
  }
  r = c.Get("/v1/models/a2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["parent"], "base");
}

TEST_F(ServeLora, ConcurrentMixOverFourAdaptersEqualsEachAlone) {
  start(false);
  const std::vector<std::string> models = {"base", "a0", "a1", "a2", "a3"};
  const char* prompts[] = {"Once upon a time", "The dog", "She said", "In the park", "A little"};
  // Alone, one request at a time.
  std::vector<std::string> want;
  for (int i = 0; i < 20; ++i) want.push_back(complete(models[size_t(i) % 5], prompts[(i / 5 + i) % 5]));
  // The adapters change the answers.
  int differ = 0;
  for (int i = 1; i < 5; ++i) differ += want[size_t(i)] != complete("base", prompts[(0 + i) % 5]);
  EXPECT_GE(differ, 3);
  // Together: 20 requests at once (16 over four adapters, 4 on the base).
  std::vector<std::string> got(20);
  std::vector<std::thread> threads;
  for (int i = 0; i < 20; ++i)
    threads.emplace_back([&, i] { got[size_t(i)] = complete(models[size_t(i) % 5], prompts[(i / 5 + i) % 5]); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "request " << i << " on " << models[size_t(i) % 5];
}

TEST_F(ServeLora, UnknownAdapterIs404ListingTheNames) {
  start(false);
  auto r = post("/v1/completions", {{"model", "nope"}, {"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("`base`, `a0`, `a1`, `a2`, `a3`"), std::string::npos) << r->body;
  // Runtime updates are off unless asked for.
  r = post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", adapter_path(4)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403) << r->body;
}

TEST_F(ServeLora, AdaptersLoadAndUnloadAtRunTime) {
  start(true);
  const std::string before = complete("base", "Once upon a time");
  auto r = post("/v1/load_lora_adapter", {{"lora_name", "late"}, {"lora_path", adapter_path(4)}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("added successfully"), std::string::npos);
  const std::string with = complete("late", "Once upon a time");
  EXPECT_NE(with, before);
  // The same name again, a file that is no adapter, an adapter of another base, a bad body.
  r = post("/v1/load_lora_adapter", {{"lora_name", "late"}, {"lora_path", adapter_path(3)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("already loaded"), std::string::npos) << r->body;
  r = post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_ + "/base.gguf"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("not a LoRA adapter"), std::string::npos) << r->body;
  r = post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_ + "/other-adapter.gguf"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("architecture \\\"qwen2\\\""), std::string::npos) << r->body;
  r = post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_ + "/missing.gguf"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("missing.gguf"), std::string::npos) << r->body;
  r = post("/v1/load_lora_adapter", {{"lora_name", 3}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("lora_name"), std::string::npos) << r->body;
  r = post("/v1/load_lora_adapter", {{"lora_name", "base"}, {"lora_path", adapter_path(4)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);

  // Unload while a long stream runs on the adapter: the stream finishes whole, and the unload
  // answers after it.
  std::atomic<int64_t> stream_done_ns{0}, unload_done_ns{0};
  std::string stream_body;
  std::thread streamer([&] {
    auto c = client();
    const json body = {{"model", "late"}, {"prompt", "Once upon a time"}, {"max_tokens", 100}, {"temperature", 0},
                       {"ignore_eos", true}, {"stream", true}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (res) stream_body = res->body;
    stream_done_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  r = post("/v1/unload_lora_adapter", {{"lora_name", "late"}});
  unload_done_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  streamer.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(stream_body.find("[DONE]"), std::string::npos) << stream_body.substr(0, 300);
  EXPECT_GE(unload_done_ns.load(), stream_done_ns.load() - 5'000'000) << "the unload answered before the stream ended";
  // Gone: 404, and unloading again is 404.
  r = post("/v1/completions", {{"model", "late"}, {"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = post("/v1/unload_lora_adapter", {{"lora_name", "late"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  // The others still answer as before.
  EXPECT_EQ(complete("base", "Once upon a time"), before);
}

}  // namespace
}  // namespace tern
