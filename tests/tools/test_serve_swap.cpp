// A live base swap in `tern serve` (POST /admin/swap_base, in-process: the real Engine,
// SingleModelProvider and Server, with a loader like cmd_serve's): the admin key gates it (403
// off, 401 without it), a swap that cannot load changes nothing, 32 concurrent streams run
// through a swap with no failure and every answer wholly from one base, adapters move to the
// new base (or are refused when they do not fit), metrics never go back, and the old engine is
// released once its last request has ended.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/synth.h"
#include "server/backend.h"
#include "server/http_test_util.h"
#include "server/model_provider.h"
#include "server/server.h"
#include "test_util.h"
#include "tools/serve_models.h"

namespace tern {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kAdminKey = "admin-sekret";
constexpr int kMaxTokens = 48;

std::string repo_model() { return std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf"; }
std::string fingerprint_of(const std::string& path) { return "fp_" + std::filesystem::path(path).stem().string(); }

EngineConfig engine_config() {
  EngineConfig c;
  c.n_threads = 2;
  c.n_ctx = 256;
  c.n_parallel = 40;
  c.max_running = 40;
  return c;
}

// What a loaded base owns (cmd_serve's LoadedEngine, for the test).
struct TestEngine {
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::EngineBackend> backend;
  ~TestEngine() {
    if (engine) engine->stop();
  }
};

// Greedy texts of `prompts` on `path` (+ an adapter), each run alone on an engine of its own
// (no prefix cache: nothing computed for another prompt is reused): what a server's answers
// must equal.
std::vector<std::string> direct_greedy(const std::string& path, const std::vector<std::string>& prompts,
                                       const LoraSet& lora = {}) {
  auto file = open_model_file(path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig ecfg = engine_config();
  ecfg.prefix_caching = false;
  Engine engine(file, tok, ecfg);
  std::vector<std::string> out;
  for (const std::string& prompt : prompts) {
    RequestParams p;
    p.prompt_ids = tok->encode(prompt, tok->add_bos_default(), true);
    p.max_tokens = kMaxTokens;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    p.lora = lora;
    std::string text;
    bool done = false;
    engine.add_request(p, [&](const RequestOutput& o) {
      text += o.text;
      if (o.finished) done = true;
    });
    while (!done) engine.step();
    out.push_back(text);
  }
  return out;
}
std::string direct_greedy(const std::string& path, const std::string& prompt, const LoraSet& lora = {}) {
  return direct_greedy(path, std::vector<std::string>{prompt}, lora)[0];
}

class ServeSwap : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_serve_swap");
    SynthOptions o;
    o.shape = "llama3-tiny";
    o.type = DType::F32;
    o.seed = 5;
    synth_model(o, dir_ + "/synth.gguf");
    const GgufFile synth = GgufFile::open(dir_ + "/synth.gguf");
    write_lora_adapter(dir_ + "/synth-adapter.gguf", synth.get_string("general.architecture"), 4.0f,
                       LoraAdapter::random_pairs(synth, 2, 40, /*b_std=*/0.8f));
    const GgufFile stories = GgufFile::open(repo_model());
    for (int a = 0; a < 2; ++a)
      write_lora_adapter(adapter_path(a), stories.get_string("general.architecture"), float(4 << a),
                         LoraAdapter::random_pairs(stories, int64_t(2) << a, 70u + uint32_t(a), /*b_std=*/0.8f));
    // Garbage with a model's name: the loader must refuse it, naming it.
    std::ofstream(dir_ + "/corrupt.gguf", std::ios::binary) << std::string(4096, '\x5a');
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string adapter_path(int a) { return dir_ + "/stories-adapter" + std::to_string(a) + ".gguf"; }

  // Loads a base as cmd_serve's loader does (engine started, owner set).
  server::SingleModelProvider::LoadedBase load(const std::string& path) {
    if (slow_loads_) std::this_thread::sleep_for(600ms);
    auto owner = std::make_shared<TestEngine>();
    owner->file = open_model_file(path);
    owner->tok = Tokenizer::from_gguf(*owner->file);
    owner->engine = std::make_unique<Engine>(owner->file, owner->tok, engine_config());
    owner->backend = std::make_unique<server::EngineBackend>(*owner->engine);
    owner->engine->start();
    auto m = std::make_shared<server::ServedModel>();
    m->id = "tern";
    m->backend = owner->backend.get();
    m->system_fingerprint = fingerprint_of(path);
    m->structured = std::make_shared<server::StructuredOutput>(*owner->tok);
    m->entry.name = "tern";
    m->entry.path = path;
    server::SingleModelProvider::LoadedBase out;
    const Engine* engine = owner->engine.get();
    out.check = [engine](const LoraAdapter& a) { engine->check_lora(a); };
    out.other_names = {std::filesystem::path(path).filename().string()};
    {
      std::lock_guard lock(owners_mu_);
      owners_.push_back(owner);
    }
    m->owner = std::move(owner);
    out.model = std::move(m);
    return out;
  }

  // A server on `path` with swaps enabled (`admin_key` "" : the admin endpoints off).
  void start(const std::string& path, const std::string& admin_key = kAdminKey, const std::string& api_key = "",
             bool adapters = false) {
    auto first = load(path);
    provider_ = std::make_unique<server::SingleModelProvider>(first.model, first.other_names, false);
    if (adapters) provider_->enable_adapters(first.check);
    provider_->enable_swap([this](const std::string& p) { return load(p); });
    server::ServerConfig c;
    c.port = 0;
    c.http_threads = 72;
    c.max_in_flight = 64;
    c.admin_key = admin_key;
    c.api_key = api_key;
    server_ = std::make_unique<server::Server>(*provider_, c);
    server_->start();
  }
  void TearDown() override {
    if (server_) server_->shutdown(0ms);
    server_.reset();
    provider_.reset();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body, const std::string& bearer = kAdminKey) const {
    auto c = client();
    httplib::Headers h;
    if (!bearer.empty()) h.emplace("Authorization", "Bearer " + bearer);
    return c.Post(path, h, body, "application/json");
  }
  httplib::Result swap(const json& body) const { return post("/admin/swap_base", body.dump()); }
  // Greedy completion of `prompt` on `model` (not streamed): its text and fingerprint.
  std::pair<std::string, std::string> complete(const std::string& model, const std::string& prompt,
                                               int want_status = 200) const {
    const json body = {{"model", model},       {"prompt", prompt},     {"max_tokens", kMaxTokens},
                       {"temperature", 0},     {"ignore_eos", true}};
    auto r = post("/v1/completions", body.dump(), "");
    EXPECT_TRUE(r);
    if (!r) return {"(no answer)", ""};
    EXPECT_EQ(r->status, want_status) << r->body;
    const json j = json::parse(r->body);
    if (r->status != 200) return {j["error"].value("code", std::string()), ""};
    return {j["choices"][0]["text"].get<std::string>(), j.value("system_fingerprint", std::string())};
  }

  static std::string dir_;
  std::atomic<bool> slow_loads_{false};
  std::mutex owners_mu_;
  std::vector<std::weak_ptr<TestEngine>> owners_;  // every base loaded, to see them released
  std::unique_ptr<server::SingleModelProvider> provider_;
  std::unique_ptr<server::Server> server_;
};
std::string ServeSwap::dir_;

TEST_F(ServeSwap, OffWithoutAnAdminKey) {
  start(repo_model(), /*admin_key=*/"");
  auto r = swap({{"model", repo_model()}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403) << r->body;
  EXPECT_NE(r->body.find("--admin-key"), std::string::npos) << r->body;
}

TEST_F(ServeSwap, OnlyTheAdminKeyOpensIt) {
  start(repo_model(), kAdminKey, /*api_key=*/"api-key");
  const std::string body = json{{"model", repo_model()}}.dump();
  for (const std::string& bearer : {std::string(), std::string("wrong"), std::string("api-key"),
                                    std::string(kAdminKey) + "x", std::string(kAdminKey).substr(1)}) {
    auto r = post("/admin/swap_base", body, bearer);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << "bearer '" << bearer << "': " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_admin_key");
  }
  // The admin key is no API key either.
  auto c = client();
  auto r = c.Get("/v1/models", {{"Authorization", std::string("Bearer ") + kAdminKey}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = post("/admin/swap_base", body, kAdminKey);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServeSwap, RefusedSwapsChangeNothing) {
  start(repo_model());
  const auto before = complete("tern", "Once upon a time");
  EXPECT_EQ(before.second, fingerprint_of(repo_model()));
  const auto expect_400 = [&](const std::string& body, const std::string& says) {
    auto r = post("/admin/swap_base", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body << " -> " << r->body;
    EXPECT_NE(r->body.find(says), std::string::npos) << body << " -> " << r->body;
    EXPECT_EQ(complete("tern", "Once upon a time"), before) << "after " << body;
  };
  expect_400("{not json", "JSON object");
  expect_400("[]", "JSON object");
  expect_400("{}", "model");
  expect_400(json{{"model", 3}}.dump(), "model");
  expect_400(json{{"model", dir_ + "/missing.gguf"}}.dump(), dir_ + "/missing.gguf");
  expect_400(json{{"model", dir_ + "/corrupt.gguf"}}.dump(), dir_ + "/corrupt.gguf");
  expect_400(json{{"model", repo_model()}, {"lora", "x"}}.dump(), "lora");
  expect_400(json{{"model", repo_model()}, {"lora", {{{"lora_name", "a"}}}}}.dump(), "lora_path");
  expect_400(json{{"model", repo_model()}, {"lora", {{{"lora_name", "a"}, {"lora_path", adapter_path(0)}, {"scale", "x"}}}}}.dump(),
             "scale");
  // An adapter that does not fit the new base: the old base stays.
  expect_400(json{{"model", repo_model()}, {"lora", {{{"lora_name", "a"}, {"lora_path", dir_ + "/synth-adapter.gguf"}}}}}.dump(),
             "synth-adapter.gguf");
  // Every base loaded by a refused swap was released at once (the first one serves).
  std::lock_guard lock(owners_mu_);
  int alive = 0;
  for (const auto& w : owners_) alive += !w.expired();
  EXPECT_EQ(alive, 1);
}

TEST_F(ServeSwap, SecondSwapWhileOneRunsIs409) {
  start(repo_model());
  slow_loads_ = true;
  std::thread first([&] {
    auto r = swap({{"model", repo_model()}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  });
  std::this_thread::sleep_for(200ms);
  auto r = swap({{"model", repo_model()}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  first.join();
  slow_loads_ = false;
}

TEST(ServeSwapPool, PoolIs501) {
  std::vector<server::ModelEntry> entries = {server::inspect_model_file(repo_model())};
  entries[0].name = "stories";
  server::ModelPoolConfig pcfg;
  ServeLoadSettings load;
  load.log_loads = false;
  PoolModelProvider pool(entries, pcfg, load);
  server::ServerConfig c;
  c.port = 0;
  c.admin_key = kAdminKey;
  server::Server srv(pool, c);
  srv.start();
  httplib::Client cl("127.0.0.1", srv.port());
  auto r = cl.Post("/admin/swap_base", {{"Authorization", std::string("Bearer ") + kAdminKey}},
                   json{{"model", repo_model()}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 501) << r->body;
  srv.shutdown(0ms);
}

// One stream's answer: its text and the fingerprints its chunks carried.
struct StreamResult {
  bool ok = false;
  std::string error;
  std::string text;
  std::set<std::string> fingerprints;
  std::chrono::steady_clock::time_point first_chunk, done;
};

TEST_F(ServeSwap, ThirtyTwoStreamsRunThroughALiveSwap) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string old_base = tern::testing::shared_path("models/stories260K.gguf");
  const std::string new_base = repo_model();
  constexpr int kStreams = 32;
  std::vector<std::string> prompts;
  const char* subjects[] = {"a little girl", "a big dog", "the sun", "a small bird", "Tim", "Lily", "a red ball", "the king"};
  const char* openings[] = {"Once upon a time, ", "One day, ", "In the park, ", "Yesterday, "};
  for (int i = 0; i < kStreams; ++i) prompts.push_back(std::string(openings[i % 4]) + subjects[(i / 4) % 8]);
  // Each base's answer to each prompt, run alone.
  const std::vector<std::string> want_old = direct_greedy(old_base, prompts);
  const std::vector<std::string> want_new = direct_greedy(new_base, prompts);
  int differ = 0;
  for (int i = 0; i < kStreams; ++i) differ += want_old[size_t(i)] != want_new[size_t(i)];
  ASSERT_EQ(differ, kStreams) << "the two bases must answer every prompt differently";

  start(old_base);
  ASSERT_EQ(complete("tern", prompts[0]).first, want_old[0]);

  // Counters sampled all along: none may go back.
  std::atomic<bool> sampling{true};
  std::atomic<int> went_back{0};
  std::thread sampler([&] {
    EngineMetrics last;
    while (sampling.load()) {
      const EngineMetrics m = provider_->metrics();
      if (m.requests_finished < last.requests_finished || m.generated_tokens_total < last.generated_tokens_total ||
          m.prompt_tokens_total < last.prompt_tokens_total || m.steps < last.steps)
        ++went_back;
      last = m;
      std::this_thread::sleep_for(1ms);
    }
  });

  std::vector<StreamResult> results(kStreams);
  std::vector<std::atomic<bool>> finished(kStreams);
  std::mutex mu;
  std::condition_variable cv;
  int started_first_group = 0;
  std::chrono::steady_clock::time_point swap_started, swap_done;
  const auto run_stream = [&](int i) {
    StreamResult& res = results[size_t(i)];
    tern::testing::RawConn conn(server_->port());
    if (!conn.ok()) {
      res.error = "no connection";
      return;
    }
    const json body = {{"model", "tern"}, {"prompt", prompts[size_t(i)]}, {"max_tokens", kMaxTokens},
                       {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
    conn.send_all(tern::testing::http_post("/v1/completions", body.dump()));
    conn.read_until("data: {", 60s);
    res.first_chunk = std::chrono::steady_clock::now();
    if (i < 8) {
      std::lock_guard lock(mu);
      ++started_first_group;
      cv.notify_all();
    }
    const std::string all = conn.read_until("data: [DONE]\n\n", 120s);
    res.done = std::chrono::steady_clock::now();
    finished[size_t(i)] = true;
    if (tern::testing::status_of(all) != 200) {
      res.error = all.substr(0, 300);
      return;
    }
    bool done = false;
    try {
      for (const json& ev : tern::testing::sse_json(all.substr(all.find("\r\n\r\n")), &done)) {
        if (ev.contains("error")) {
          res.error = ev.dump();
          return;
        }
        res.fingerprints.insert(ev.value("system_fingerprint", std::string("(none)")));
        for (const auto& c : ev["choices"]) res.text += c.value("text", std::string());
      }
    } catch (const std::exception& e) {
      res.error = e.what();
      return;
    }
    res.ok = done;
    if (!done) res.error = "no [DONE]";
  };

  std::vector<std::thread> threads;
  // 8 streams that are running on the old base before the swap begins...
  for (int i = 0; i < 8; ++i) threads.emplace_back(run_stream, i);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return started_first_group >= 1; }));
  }
  // ...held there: the old engine pauses (its requests keep their state), so that they, and
  // 8 more queued behind them, are certainly unfinished when the new base takes over.
  std::shared_ptr<TestEngine> old_engine;
  {
    std::lock_guard lock(owners_mu_);
    old_engine = owners_.front().lock();
  }
  ASSERT_TRUE(old_engine);
  old_engine->engine->stop();
  // Those the engine finished before it paused have their answers within a moment.
  std::this_thread::sleep_for(200ms);
  std::vector<bool> held(kStreams, false);
  int n_held = 0;
  for (int i = 0; i < 8; ++i) n_held += held[size_t(i)] = !finished[size_t(i)];
  {
    // Each request holds the base it acquired: with the engine paused, the count only grows.
    server::ModelRef old_model = provider_->acquire("tern", std::nullopt).model;
    const long baseline = old_model.use_count();
    for (int i = 8; i < 16; ++i) threads.emplace_back(run_stream, i), held[size_t(i)] = true, ++n_held;
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (old_model.use_count() < baseline + 8 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(1ms);
    ASSERT_GE(old_model.use_count(), baseline + 8);
  }
  // ...8 started while the swap loads (either base may take them: the swap answers within
  // their span, or after it)...
  std::thread swapper([&] {
    swap_started = std::chrono::steady_clock::now();
    auto r = swap({{"model", new_base}});
    swap_done = std::chrono::steady_clock::now();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["path"], new_base);
    EXPECT_EQ(j["fingerprint"], fingerprint_of(new_base));
    EXPECT_EQ(j["adapters"], json::array());
    EXPECT_GE(j["load_seconds"].get<double>(), 0.0);
  });
  for (int i = 16; i < 24; ++i) {
    threads.emplace_back(run_stream, i);
    std::this_thread::sleep_for(100ms);
  }
  swapper.join();
  // ...and 8 once it has answered; then the old engine goes on with its requests.
  for (int i = 24; i < kStreams; ++i) threads.emplace_back(run_stream, i);
  old_engine->engine->start();
  old_engine.reset();
  for (auto& t : threads) t.join();

  // Bit-equal batched and lone answers need batch-invariant matmuls for both bases' weights
  // (stories260K f32, tern-stories Q8_0); this CPU's kernels are checked, not assumed.
  const bool batch_invariant = tern::testing::matmul_is_batch_invariant(DType::F32) &&
                               tern::testing::matmul_is_batch_invariant(DType::Q8_0);
  int n_old = 0, n_new = 0, n_old_after_swap = 0, n_parted = 0;
  for (int i = 0; i < kStreams; ++i) {
    const StreamResult& r = results[size_t(i)];
    ASSERT_TRUE(r.ok) << "stream " << i << ": " << r.error;
    ASSERT_EQ(r.fingerprints.size(), 1u) << "stream " << i << " mixed fingerprints";
    const std::string fp = *r.fingerprints.begin();
    if (r.text == want_old[size_t(i)]) {
      ++n_old;
      EXPECT_EQ(fp, fingerprint_of(old_base)) << "stream " << i;
      EXPECT_LT(i, 24) << "stream " << i << " started after the swap answered, on the old base";
      if (held[size_t(i)]) {
        EXPECT_GT(r.done, swap_done) << "stream " << i << " ended before the swap, the engine paused";
      }
      if (r.done > swap_done) ++n_old_after_swap;
    } else if (r.text == want_new[size_t(i)]) {
      ++n_new;
      EXPECT_EQ(fp, fingerprint_of(new_base)) << "stream " << i;
      EXPECT_GE(i, 16) << "stream " << i << " was running before the swap, yet answered from the new base";
    } else if (!batch_invariant) {
      // A kernel that rounds a batch's rows unlike a lone row (matmul_is_batch_invariant) may
      // part a batched answer from the lone one at a near tie: then the chunks' fingerprint says
      // which base answered, and the text must follow that base's lone answer for a while.
      const std::string& want = fp == fingerprint_of(old_base) ? want_old[size_t(i)] : want_new[size_t(i)];
      size_t d = 0;
      while (d < r.text.size() && d < want.size() && r.text[d] == want[d]) ++d;
      EXPECT_GE(d, std::min<size_t>(8, want.size())) << "stream " << i << " (" << fp << "): " << r.text << "\nwant: " << want;
      (fp == fingerprint_of(old_base) ? n_old : n_new) += 1;
      ++n_parted;
    } else {
      ADD_FAILURE() << "stream " << i << " is from neither base: " << r.text << "\nold: " << want_old[size_t(i)]
                    << "\nnew: " << want_new[size_t(i)];
    }
  }
  EXPECT_GE(n_old, 16);
  EXPECT_GE(n_new, 8);
  EXPECT_GE(n_old_after_swap, n_held);
  EXPECT_GE(n_held, 8);
  if (n_parted > 0) std::printf("note: %d answers parted from the lone answer at a near tie (kernels not batch-invariant)\n", n_parted);
  std::printf("note: %d streams on the old base (%d of them ending after the swap answered), %d on the new; the swap "
              "took %.0f ms\n", n_old, n_old_after_swap, n_new,
              std::chrono::duration<double, std::milli>(swap_done - swap_started).count());

  // After the swap: the new base answers, under the same public id; /v1/models shows its file.
  EXPECT_EQ(complete("tern", prompts[1]), std::make_pair(want_new[1], fingerprint_of(new_base)));
  auto c = client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  const json models = json::parse(r->body);
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "tern");
  r = c.Post("/api/show", json{{"model", "tern"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;

  // The old engine is released once its last request has ended (by the server's collector,
  // about once a second), and its counters stay in the totals.
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  const auto old_alive = [&] {
    std::lock_guard lock(owners_mu_);
    return !owners_.front().expired();
  };
  while (old_alive() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(old_alive()) << "the swapped-away engine was never released";
  sampling = false;
  sampler.join();
  EXPECT_EQ(went_back.load(), 0);
  EXPECT_EQ(provider_->metrics().requests_finished, kStreams + 2);  // + the two single completions
  EXPECT_EQ(provider_->metrics().generated_tokens_total, int64_t(kStreams + 2) * kMaxTokens);
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find(std::to_string(int64_t(kStreams + 2) * kMaxTokens)), std::string::npos);
}

TEST_F(ServeSwap, AdaptersMoveToTheNewBase) {
  const std::string synth = dir_ + "/synth.gguf";
  start(synth, kAdminKey, "", /*adapters=*/true);
  provider_->add_adapter("old", LoraAdapter::load(dir_ + "/synth-adapter.gguf"), 1.0f);
  const std::string prompt = "Once upon a time";
  ASSERT_EQ(complete("old", prompt).second, fingerprint_of(synth));

  // To tern-stories with two adapters of its own.
  auto r = swap({{"model", repo_model()},
                 {"lora", {{{"lora_name", "s0"}, {"lora_path", adapter_path(0)}},
                           {{"lora_name", "s1"}, {"lora_path", adapter_path(1)}, {"scale", 0.5}}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["adapters"], json::array({"s0", "s1"}));
  const std::string want_base = direct_greedy(repo_model(), prompt);
  const std::string want_s0 = direct_greedy(repo_model(), prompt, {LoraUse{LoraAdapter::load(adapter_path(0)), 1.0f}});
  const std::string want_s1 = direct_greedy(repo_model(), prompt, {LoraUse{LoraAdapter::load(adapter_path(1)), 0.5f}});
  EXPECT_NE(want_s0, want_base);
  EXPECT_NE(want_s1, want_base);
  EXPECT_EQ(complete("tern", prompt), std::make_pair(want_base, fingerprint_of(repo_model())));
  EXPECT_EQ(complete("s0", prompt), std::make_pair(want_s0, fingerprint_of(repo_model())));
  EXPECT_EQ(complete("s1", prompt), std::make_pair(want_s1, fingerprint_of(repo_model())));
  // The old base's adapter is gone: 404, naming what is served.
  EXPECT_EQ(complete("old", prompt, 404).first, "model_not_found");
  auto c = client();
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  const json models = json::parse(r->body);
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][1]["id"], "s0");
  EXPECT_EQ(models["data"][1]["parent"], "tern");
  EXPECT_EQ(models["data"][2]["root"], adapter_path(1));

  // Without "lora", the adapters served are loaded again against the new base.
  r = swap({{"model", repo_model()}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["adapters"], json::array({"s0", "s1"}));
  EXPECT_EQ(complete("s1", prompt).first, want_s1);
  // ... and where they do not fit, nothing changes.
  r = swap({{"model", synth}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("s0"), std::string::npos) << r->body;
  EXPECT_EQ(complete("s0", prompt).first, want_s0);
  // "lora": [] drops them.
  r = swap({{"model", synth}, {"lora", json::array()}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(complete("s0", prompt, 404).first, "model_not_found");
  EXPECT_EQ(complete("tern", prompt).second, fingerprint_of(synth));
}

// `tern serve` as a user runs it: --admin-key from the environment, cmd_serve's loader (the
// start-up settings again, the fingerprint of the new file), the id kept, one stderr line.
TEST_F(ServeSwap, TernServeSwapsWithItsOwnLoader) {
  // A free port, released for the server to take.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  const std::string copy = dir_ + "/copy-of-stories.gguf";
  std::filesystem::copy_file(repo_model(), copy, std::filesystem::copy_options::overwrite_existing);
  const std::string log = dir_ + "/serve.log";
  const std::string tern = TERN_BINARY;
  const std::string model = repo_model();
  const std::string port_text = std::to_string(port);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("TERN_ADMIN_KEY", kAdminKey, 1);
    std::FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    ::execl(tern.c_str(), tern.c_str(), "serve", "-m", model.c_str(), "--port", port_text.c_str(), "--threads", "1",
            "--ctx", "128", "--parallel", "2", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  struct Stop {
    pid_t pid;
    ~Stop() {
      ::kill(pid, SIGTERM);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } stop{pid};
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  bool up = false;
  while (!up && std::chrono::steady_clock::now() < give_up) {
    auto r = c.Get("/health");
    up = r && r->status == 200;
    if (!up) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(up) << tern::testing::read_file_bytes(log);
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json before = json::parse(r->body);

  r = c.Post("/admin/swap_base", json{{"model", copy}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  const httplib::Headers admin = {{"Authorization", std::string("Bearer ") + kAdminKey}};
  r = c.Post("/admin/swap_base", admin, json{{"model", dir_ + "/corrupt.gguf"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("corrupt.gguf"), std::string::npos) << r->body;
  r = c.Post("/admin/swap_base", admin, json{{"model", copy}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json swapped = json::parse(r->body);
  EXPECT_EQ(swapped["path"], copy);
  EXPECT_NE(swapped["fingerprint"], before["system_fingerprint"]);

  r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json after = json::parse(r->body);
  EXPECT_EQ(after["system_fingerprint"], swapped["fingerprint"]);
  EXPECT_EQ(after["model"], before["model"]);  // the public id stays
  EXPECT_EQ(after["choices"][0]["text"], before["choices"][0]["text"]);  // the same weights
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  const json models = json::parse(r->body);
  EXPECT_EQ(models["data"][0]["id"], "tern-stories");
  EXPECT_EQ(models["data"][0]["max_model_len"], 128);  // the start-up settings again
  r = c.Post("/api/show", json{{"model", "tern-stories"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("tern_engine_requests_finished_total 2"), std::string::npos) << r->body.substr(0, 2000);
  const std::string err = tern::testing::read_file_bytes(log);
  EXPECT_NE(err.find("tern serve: base swapped to " + copy), std::string::npos) << err;
  EXPECT_NE(err.find("refused (400)"), std::string::npos) << err;
}

}  // namespace
}  // namespace tern
