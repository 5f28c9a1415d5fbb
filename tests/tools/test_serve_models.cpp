// The models of a multi-model `tern serve` (tools/serve_models.h): names, aliases and
// NAME:latest resolve, unknown and missing names are the API's errors, a ModelRef keeps its
// model loaded, the pool's LRU and keep_alive rules hold over real engines (three synth
// models), counters survive unloads, and concurrent requests on more models than may be
// loaded all get the right answers. models.json variants ("from") and adapters: a variant and
// its base share one load, a variant's adapter gives exactly the tokens of that adapter applied
// to the base, a variant whose adapter does not fit is skipped and one that cannot run on a
// load answers 500 while the base serves, a variant's lease keeps its base loaded, and a
// variant's keep_alive rules its own requests. Then `tern serve --models` errors as a user sees
// them, and SingleModelProvider's naming rules over a fake backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "lora_fixture.h"
#include "models/lora.h"
#include "models/synth.h"
#include "server/api_error.h"
#include "server/model_catalog.h"
#include "server/model_provider.h"
#include "test_util.h"
#include "tools/serve_models.h"

namespace tern {
namespace {

namespace fs = std::filesystem;
using server::ApiError;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// Greedy tokens of `prompt` on `m`, as text of ids ("12 7 301 ..."), with the model's adapters
// (as the server runs a request) or, given, `lora` instead.
std::string generate(const server::ServedModel& m, const std::string& prompt, int64_t max_tokens = 6,
                     const std::optional<LoraSet>& lora = std::nullopt) {
  RequestParams p;
  p.prompt_ids = m.backend->tokenizer().encode(prompt, /*add_bos=*/true);
  p.max_tokens = max_tokens;
  p.lora = lora.value_or(m.lora);
  p.ignore_eos = true;
  p.sampling.temperature = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string ids;
  FinishReason reason = FinishReason::None;
  const uint64_t id = m.backend->add_request(std::move(p), [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    for (const GeneratedToken& t : o.tokens) ids += std::to_string(t.id) + " ";
    if (o.finished) {
      reason = o.finish_reason;
      done = true;
      cv.notify_all();
    }
  });
  EXPECT_GT(id, 0u);
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  EXPECT_EQ(reason, FinishReason::Length);
  return ids;
}

std::vector<std::string> loaded_names(const server::ModelProvider& p) {
  std::vector<std::string> out;
  for (const server::LoadedModelInfo& m : p.loaded()) out.push_back(m.entry.name);
  std::sort(out.begin(), out.end());
  return out;
}

ServeLoadSettings test_settings(bool log_loads = false) {
  ServeLoadSettings s;
  s.engine.n_threads = 1;
  s.engine.n_parallel = 2;
  s.ctx = 256;
  s.log_loads = log_loads;
  return s;
}

// What `fn` throws as an ApiError; a test failure (and an empty error) when it throws none.
template <class Fn>
ApiError api_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no throw";
  return ApiError(0, "", "", "", "");
}

class ServeModels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_serve_models");
    for (int i = 0; i < 3; ++i) {
      SynthOptions o;
      o.shape = "llama3-tiny";  // decisive logits (init_gain): greedy answers do not depend on batching
      o.type = DType::F32;
      o.seed = uint64_t(11 + i);
      synth_model(o, dir_ + "/" + kNames[i] + ".gguf");
    }
  }
  static void TearDownTestSuite() { tern::testing::remove_temp_dir(dir_); }

  static std::vector<server::ModelEntry> entries() {
    std::vector<server::ModelEntry> e = server::scan_models_dir(dir_);
    for (auto& x : e)
      if (x.name == "alpha") x.defaults.aliases = {"first"};
    return e;
  }
  static std::unique_ptr<PoolModelProvider> provider(int max_loaded = 0, int64_t max_memory = 0,
                                                      double keep_alive_s = -1) {
    server::ModelPoolConfig c;
    c.max_loaded = max_loaded;
    c.max_memory_bytes = max_memory;
    c.default_keep_alive_s = keep_alive_s;
    c.wait_for_room = std::chrono::milliseconds(30000);
    return std::make_unique<PoolModelProvider>(entries(), c, test_settings());
  }

  static constexpr const char* kNames[3] = {"alpha", "beta", "gamma"};
  static std::string dir_;
};
std::string ServeModels::dir_;

TEST_F(ServeModels, NamesAliasesAndLatest) {
  auto p = provider();
  ASSERT_EQ(p->models().size(), 3u);
  EXPECT_EQ(p->models()[0].name, "alpha");
  EXPECT_EQ(p->models()[2].name, "gamma");
  EXPECT_TRUE(p->serves("beta"));
  EXPECT_TRUE(p->serves("first"));
  EXPECT_TRUE(p->serves("gamma:latest"));
  EXPECT_FALSE(p->serves("delta"));
  EXPECT_FALSE(p->serves(""));
  EXPECT_TRUE(loaded_names(*p).empty());  // nothing loads before a request
  EXPECT_EQ(p->n_ctx_of("beta"), 256);    // planned

  server::Acquired a = p->acquire("alpha");
  EXPECT_EQ(a.model->id, "alpha");
  EXPECT_GT(a.load_ns, 0);
  EXPECT_EQ(a.model->entry.name, "alpha");
  EXPECT_EQ(a.model->metadata.value("general.architecture", ""), "llama");
  EXPECT_FALSE(a.model->metadata.contains("tokenizer.ggml.tokens"));  // arrays are left out
  EXPECT_GT(a.model->bytes, a.model->entry.file_bytes);
  ASSERT_NE(a.model->structured, nullptr);
  server::Acquired again = p->acquire("first");
  EXPECT_EQ(again.model.get(), a.model.get());
  EXPECT_EQ(again.load_ns, 0);
  EXPECT_EQ(p->acquire("alpha:latest").model->id, "alpha");
  EXPECT_EQ(p->n_ctx_of("alpha"), 256);
  const auto rows = p->loaded();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].entry.name, "alpha");
  EXPECT_EQ(rows[0].leases, 2);
  EXPECT_EQ(rows[0].n_ctx, 256);
  EXPECT_EQ(rows[0].bytes, a.model->bytes);
  EXPECT_FALSE(rows[0].expires.has_value());  // keep_alive -1: never, in use or not
}

TEST_F(ServeModels, UnknownAndMissingNames) {
  auto p = provider();
  {
    const ApiError e = api_error_of([&] { p->acquire("delta"); });
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.code(), "model_not_found");
    EXPECT_EQ(e.param(), "model");
    for (const char* n : kNames) EXPECT_TRUE(contains(e.what(), std::string("`") + n + "`")) << e.what();
  }
  {
    const ApiError e = api_error_of([&] { p->acquire(""); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "model");
    EXPECT_TRUE(contains(e.what(), "model is required")) << e.what();
  }
  EXPECT_THROW(p->unload("delta"), ApiError);
  EXPECT_TRUE(loaded_names(*p).empty());
}

TEST_F(ServeModels, RefKeepsModelLoadedAndReloadGivesSameAnswer) {
  auto p = provider();
  std::string first;
  {
    server::Acquired a = p->acquire("beta", /*keep_alive_s=*/0.0);
    first = generate(*a.model, "Once upon a time");
    p->unload("beta");  // in use: stays until the ref ends
    EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"beta"});
    EXPECT_EQ(generate(*a.model, "Once upon a time"), first);
  }
  EXPECT_TRUE(loaded_names(*p).empty());  // keep_alive 0: out with its last ref
  server::Acquired b = p->acquire("beta");
  EXPECT_GT(b.load_ns, 0);
  EXPECT_EQ(generate(*b.model, "Once upon a time"), first);
  EXPECT_FALSE(first.empty());
}

TEST_F(ServeModels, CountLimitUnloadsLeastRecentlyUsed) {
  auto p = provider(/*max_loaded=*/2);
  p->acquire("alpha");
  p->acquire("beta");
  p->acquire("alpha");  // beta is now the least recently used
  EXPECT_EQ(loaded_names(*p), (std::vector<std::string>{"alpha", "beta"}));
  p->acquire("gamma");
  EXPECT_EQ(loaded_names(*p), (std::vector<std::string>{"alpha", "gamma"}));
  for (const auto& row : p->loaded()) EXPECT_FALSE(row.expires.has_value());  // keep_alive -1: never
}

TEST_F(ServeModels, MemoryBudgetUnloadsLeastRecentlyUsed) {
  int64_t two = 0;
  {
    auto probe = provider();
    two = probe->estimated_bytes(0) + probe->estimated_bytes(1);  // the synth models are the same size
    ASSERT_EQ(probe->estimated_bytes(0), probe->estimated_bytes(2));
  }
  auto p = provider(/*max_loaded=*/0, /*max_memory=*/two + two / 4);
  p->acquire("beta");
  p->acquire("gamma");
  p->acquire("beta");
  p->acquire("alpha");
  EXPECT_EQ(loaded_names(*p), (std::vector<std::string>{"alpha", "beta"}));
}

TEST_F(ServeModels, BudgetBelowSmallestModelIsRefusedAtStart) {
  EXPECT_THROW(provider(0, /*max_memory=*/1024), std::invalid_argument);
}

TEST_F(ServeModels, IdleModelExpiresAfterKeepAlive) {
  auto p = provider(0, 0, /*keep_alive_s=*/60);
  p->acquire("gamma", /*keep_alive_s=*/0.2);
  const auto rows = p->loaded();
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(rows[0].expires.has_value());
  const auto left = *rows[0].expires - std::chrono::system_clock::now();
  EXPECT_LT(left, std::chrono::seconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  p->collect();
  EXPECT_TRUE(loaded_names(*p).empty());
}

TEST_F(ServeModels, CountersDoNotGoBackAfterUnload) {
  auto p = provider();
  {
    server::Acquired a = p->acquire("alpha", 0.0);
    generate(*a.model, "Hello", 5);
    server::Acquired b = p->acquire("beta");
    generate(*b.model, "Hello", 3);
    const EngineMetrics m = p->metrics();
    EXPECT_EQ(m.requests_finished, 2);
    EXPECT_EQ(m.generated_tokens_total, 8);
    EXPECT_GT(m.kv_blocks_total, 0);
  }
  EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"beta"});
  p->unload("beta");
  EXPECT_TRUE(loaded_names(*p).empty());
  const EngineMetrics m = p->metrics();
  EXPECT_EQ(m.requests_finished, 2);
  EXPECT_EQ(m.generated_tokens_total, 8);
  EXPECT_GT(m.prompt_tokens_total, 0);
  EXPECT_EQ(m.kv_blocks_total, 0);  // gauges: of the loaded models only
  EXPECT_EQ(m.n_running, 0);
}

TEST_F(ServeModels, ConcurrentAcquiresOnMoreModelsThanMayBeLoaded) {
  std::vector<std::string> expected;
  {
    auto p = provider();
    for (const char* n : kNames) expected.push_back(generate(*p->acquire(n).model, "The little dog"));
  }
  EXPECT_NE(expected[0], expected[1]);
  auto p = provider(/*max_loaded=*/2, 0, /*keep_alive_s=*/-1);
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 4; ++k) {
        const int i = (t + k) % 3;
        try {
          server::Acquired a = p->acquire(kNames[i]);
          if (generate(*a.model, "The little dog") == expected[size_t(i)]) ++ok;
          else ++failed;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          ++failed;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 32);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LE(p->loaded().size(), 2u);
  // The engine counts a request finished just after its last output reaches the caller: give
  // the last one a moment.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (p->metrics().requests_finished < 32 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(p->metrics().requests_finished, 32);
}

// models.json variants and adapters over real engines: `base` (a synth llama), `twin` (a copy of
// its file with an adapter of its own), variants of `base` with a system prompt, an adapter,
// a short keep_alive, an adapter made for another architecture and a template that cannot load.
class ServeModelVariants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_serve_variants");
    // other.model: not *.gguf, no model of the directory (its adapter is the wrong one).
    tern::testing::synth_base_and_other(dir_ + "/base.gguf", dir_ + "/other.model");
    fs::copy_file(dir_ + "/base.gguf", dir_ + "/twin.gguf");
    fs::create_directory(dir_ + "/lora");
    tern::testing::write_random_adapter(GgufFile::open(dir_ + "/base.gguf"), dir_ + "/lora/good.gguf", 4, 41);
    tern::testing::write_random_adapter(GgufFile::open(dir_ + "/other.model"), dir_ + "/lora/wrong.gguf", 2, 9);
    std::ofstream(dir_ + "/models.json") << R"({"models": {
        "brief": {"from": "base", "aliases": ["terse"], "system": "Be brief.", "options": {"temperature": 0.25}},
        "tuned": {"from": "base", "adapters": [{"file": "lora/good.gguf", "scale": 0.5}]},
        "twin": {"adapters": [{"file": "lora/good.gguf", "scale": 0.5}]},
        "quick": {"from": "base", "keep_alive": "200ms"},
        "broken": {"from": "base", "adapters": ["lora/wrong.gguf"]},
        "untemplated": {"from": "base", "chat_template": "no-such-template.jinja"}}})";
  }
  static void TearDownTestSuite() { tern::testing::remove_temp_dir(dir_); }

  // Idle models are kept forever unless a keep_alive says otherwise.
  static std::unique_ptr<PoolModelProvider> provider(bool log_loads = false) {
    server::ModelPoolConfig c;
    c.default_keep_alive_s = -1;
    return std::make_unique<PoolModelProvider>(server::scan_models_dir(dir_), c, test_settings(log_loads));
  }
  static size_t count(const std::string& s, const std::string& needle) {
    size_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }

  static constexpr const char* kPrompt = "Once upon a time";
  static std::string dir_;
};
std::string ServeModelVariants::dir_;

TEST_F(ServeModelVariants, VariantAndBaseShareOneLoad) {
  ::testing::internal::CaptureStderr();
  {
    auto p = provider(/*log_loads=*/true);
    std::vector<std::string> names;
    for (const server::ModelEntry& e : p->models()) names.push_back(e.name);
    EXPECT_EQ(names, (std::vector<std::string>{"base", "brief", "quick", "tuned", "twin", "untemplated"}));
    EXPECT_TRUE(p->serves("terse"));
    EXPECT_EQ(p->n_ctx_of("brief"), 256);
    EXPECT_TRUE(loaded_names(*p).empty());

    server::Acquired v = p->acquire("brief");
    EXPECT_GT(v.load_ns, 0);  // the variant's request loaded the base
    EXPECT_EQ(v.model->id, "brief");
    EXPECT_EQ(v.model->entry.name, "brief");
    EXPECT_EQ(v.model->entry.parent, "base");
    EXPECT_EQ(v.model->default_system, "Be brief.");
    EXPECT_EQ(v.model->default_options.value("temperature", 0.0), 0.25);
    EXPECT_TRUE(v.model->lora.empty());
    server::Acquired b = p->acquire("base");
    EXPECT_EQ(b.load_ns, 0);  // one load serves both
    EXPECT_EQ(b.model->id, "base");
    EXPECT_EQ(b.model->backend, v.model->backend);
    EXPECT_TRUE(b.model->default_system.empty());
    EXPECT_EQ(p->acquire("terse:latest").model.get(), v.model.get());  // built once per load
    EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"base"});
    EXPECT_EQ(p->loaded()[0].leases, 2);
    EXPECT_EQ(p->n_ctx_of("brief"), 256);
    EXPECT_EQ(generate(*v.model, kPrompt), generate(*b.model, kPrompt));  // no adapter: the base's tokens

    const server::ModelProvider::Description d = p->describe("terse");
    EXPECT_EQ(d.entry.name, "brief");
    EXPECT_EQ(d.entry.parent, "base");
    EXPECT_EQ(d.entry.defaults.system_prompt, "Be brief.");
    EXPECT_EQ(d.metadata.value("general.architecture", ""), "llama");
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, ": loaded base in"), 1u) << err;
  EXPECT_EQ(count(err, ": unloaded base ("), 1u) << err;
  EXPECT_EQ(count(err, "loaded brief"), 0u) << err;
}

TEST_F(ServeModelVariants, AdapterGivesTheTokensOfTheAdapterAppliedToTheBase) {
  auto p = provider();
  server::Acquired base = p->acquire("base");
  server::Acquired tuned = p->acquire("tuned");
  EXPECT_EQ(tuned.model->backend, base.model->backend);
  ASSERT_EQ(tuned.model->lora.size(), 1u);
  EXPECT_EQ(tuned.model->lora[0].scale, 0.5f);
  EXPECT_EQ(tuned.model->lora[0].adapter->path(), dir_ + "/lora/good.gguf");

  const LoraSet direct = {LoraUse{LoraAdapter::load(dir_ + "/lora/good.gguf"), 0.5f}};
  const std::string want = generate(*base.model, kPrompt, 8, direct);
  EXPECT_EQ(generate(*tuned.model, kPrompt, 8), want);
  EXPECT_NE(generate(*base.model, kPrompt, 8), want);  // the adapter changes the answer

  // A model with a file of its own runs its adapters the same way (twin: base's weights).
  server::Acquired twin = p->acquire("twin");
  EXPECT_NE(twin.model->backend, base.model->backend);
  ASSERT_EQ(twin.model->lora.size(), 1u);
  EXPECT_EQ(twin.model->lora[0].adapter.get(), tuned.model->lora[0].adapter.get());  // one load per file
  EXPECT_EQ(generate(*twin.model, kPrompt, 8), want);
  EXPECT_EQ(loaded_names(*p), (std::vector<std::string>{"base", "twin"}));
}

TEST_F(ServeModelVariants, AdapterOfAnotherModelSkipsTheVariantWithTheReason) {
  ::testing::internal::CaptureStderr();
  auto p = provider();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "skipping broken (variant of base): " + dir_ + "/lora/wrong.gguf")) << err;
  EXPECT_TRUE(contains(err, "the adapter is for architecture \"qwen2\"")) << err;
  EXPECT_FALSE(p->serves("broken"));
  {
    const ApiError e = api_error_of([&] { p->acquire("broken"); });
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.code(), "model_not_found");
  }
  EXPECT_FALSE(generate(*p->acquire("base").model, kPrompt).empty());  // the base serves
}

TEST_F(ServeModelVariants, VariantThatCannotRunOnTheLoadIs500AndTheBaseServes) {
  auto p = provider();
  EXPECT_TRUE(p->serves("untemplated"));  // the template is read at load time
  {
    const ApiError e = api_error_of([&] { p->acquire("untemplated"); });
    EXPECT_EQ(e.status(), 500);
    EXPECT_EQ(e.code(), "model_load_failed");
    EXPECT_TRUE(contains(e.what(), "The model `untemplated` cannot be served on the engine of `base`: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "no-such-template.jinja")) << e.what();
  }
  EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"base"});
  server::Acquired b = p->acquire("base");
  EXPECT_EQ(b.load_ns, 0);
  EXPECT_FALSE(generate(*b.model, kPrompt).empty());
  EXPECT_EQ(generate(*p->acquire("brief").model, kPrompt), generate(*b.model, kPrompt));
}

TEST_F(ServeModelVariants, VariantLeaseKeepsTheBaseLoaded) {
  auto p = provider();
  {
    server::Acquired v = p->acquire("tuned", /*keep_alive_s=*/0.0);
    const std::string first = generate(*v.model, kPrompt);
    p->unload("base");  // in use through the variant: stays until its ref ends
    EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"base"});
    EXPECT_EQ(p->loaded()[0].leases, 1);
    EXPECT_EQ(generate(*v.model, kPrompt), first);
  }
  EXPECT_TRUE(loaded_names(*p).empty());  // keep_alive 0: out with the variant's last ref
  p->acquire("brief");
  EXPECT_EQ(loaded_names(*p), std::vector<std::string>{"base"});
  p->unload("terse");  // a variant's name unloads its base (what holds the memory)
  EXPECT_TRUE(loaded_names(*p).empty());
}

TEST_F(ServeModelVariants, VariantKeepAliveRulesItsOwnRequests) {
  auto p = provider();  // the server's default: forever
  const auto seconds_left = [&]() -> std::optional<double> {
    const auto rows = p->loaded();
    if (rows.size() != 1 || !rows[0].expires) return std::nullopt;
    return std::chrono::duration<double>(*rows[0].expires - std::chrono::system_clock::now()).count();
  };
  p->acquire("quick");
  ASSERT_TRUE(seconds_left().has_value());
  EXPECT_LT(*seconds_left(), 1.0);  // the variant's 200ms
  p->acquire("base");
  EXPECT_FALSE(seconds_left().has_value());  // the base's request: the server's default, not the variant's
  p->acquire("quick", /*keep_alive_s=*/-1.0);
  EXPECT_FALSE(seconds_left().has_value());  // the request's own wins
  p->acquire("quick");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  p->collect();
  EXPECT_TRUE(loaded_names(*p).empty());
}

// `tern serve --models` refusing to start, as a user runs it.
TEST_F(ServeModels, CliErrors) {
  const std::string tern = TERN_BINARY;
  std::string out, err;
  int rc = tern::testing::run_command(tern + " serve --port 0 --models " + dir_ + "/nope", &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(contains(err, dir_ + "/nope")) << err;
  rc = tern::testing::run_command(tern + " serve --port 0 --models " + dir_ + " --max-memory 64K", &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(contains(err, "memory budget")) << err;
  EXPECT_TRUE(contains(err, "--max-memory")) << err;
  const std::string empty = dir_ + "/empty_dir";
  fs::create_directory(empty);
  rc = tern::testing::run_command(tern + " serve --port 0 --models " + empty, &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(contains(err, "no GGUF files")) << err;
  rc = tern::testing::run_command(tern + " serve --port 0 --models " + dir_ + " --keep-alive soon", &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(contains(err, "--keep-alive")) << err;
  rc = tern::testing::run_command(tern + " serve --port 0", &out, &err);
  EXPECT_EQ(rc, 2) << err;
}

// SingleModelProvider: acquire serves any name without strict names, only its own with them.
class FakeBackend final : public server::Backend {
 public:
  uint64_t add_request(RequestParams, OutputCallback) override { return 0; }
  void abort(uint64_t) override {}
  EngineMetrics metrics() const override {
    EngineMetrics m;
    m.requests_finished = 7;
    return m;
  }
  int64_t n_ctx() const override { return 123; }
  const Tokenizer& tokenizer() const override { throw Error("no tokenizer"); }
};

TEST(SingleModelProvider, NamesAndRows) {
  FakeBackend backend;
  auto served = std::make_shared<server::ServedModel>();
  served->id = "tiny";
  served->backend = &backend;
  served->entry.name = "tiny";
  served->bytes = 1000;
  server::SingleModelProvider loose(served, {"tiny.gguf"}, /*strict_names=*/false);
  EXPECT_EQ(loose.acquire("gpt-3.5-turbo", std::nullopt).model.get(), served.get());
  EXPECT_FALSE(loose.serves("anything"));  // serves(): its own names only (/v1/models/{id})
  EXPECT_TRUE(loose.serves("tiny.gguf"));
  server::SingleModelProvider strict(served, {"tiny.gguf"}, /*strict_names=*/true);
  EXPECT_EQ(strict.acquire("tiny", std::nullopt).load_ns, 0);
  EXPECT_EQ(strict.acquire("tiny.gguf", std::nullopt).model->id, "tiny");
  EXPECT_EQ(strict.acquire("", std::nullopt).model->id, "tiny");
  EXPECT_FALSE(strict.serves("other"));
  {
    const ApiError e = api_error_of([&] { strict.acquire("other", std::nullopt); });
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.code(), "model_not_found");
    EXPECT_EQ(std::string(e.what()), "The model `other` does not exist. This server serves `tiny`.");
  }
  const auto rows = strict.loaded();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].bytes, 1000);
  EXPECT_EQ(rows[0].n_ctx, 123);
  EXPECT_FALSE(rows[0].expires.has_value());
  EXPECT_EQ(strict.metrics().requests_finished, 7);
  EXPECT_EQ(strict.n_ctx_of("x"), 123);
  ASSERT_EQ(strict.models().size(), 1u);
}

}  // namespace
}  // namespace tern
