// Ollama's routes and per-request model choice, end to end over HTTP against scripted
// backends (fake_backend.h): two models behind one ModelProvider, each request answered by
// the model it names (OpenAI's routes too), NDJSON streams equal to whole answers, generate's
// context, load / unload requests, and every error as {"error": "..."} with its status.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

#include "fake_backend.h"
#include "server/api_error.h"
#include "server/server.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace test_ollama_http {

using namespace tern;
using namespace tern::server;
using namespace tern::testing;
using nlohmann::json;

namespace {

const std::string kAlphaScript = "alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha ";
const std::string kBetaScript = "beta beta beta beta beta beta beta beta beta beta beta beta beta beta ";

// Two fake models, alpha loaded; counts acquires and unloads so the routes' use of the
// provider can be checked. `with_variant`: also "alpha-brief", a models.json variant of alpha
// (its file's facts, parent alpha, an adapter), and alpha has a models.json chat template.
class TwoModels final : public ModelProvider {
 public:
  explicit TwoModels(bool with_variant = false) {
    for (const auto& [name, script] : {std::pair{"alpha", kAlphaScript}, std::pair{"beta", kBetaScript}}) {
      FakeBackend::Options o;
      o.script = script;
      backends_.push_back(std::make_unique<FakeBackend>(o));
      auto m = std::make_shared<ServedModel>();
      m->id = name;
      m->backend = backends_.back().get();
      m->structured = std::make_unique<StructuredOutput>(m->backend->tokenizer());
      m->entry.name = name;
      m->entry.architecture = "llama";
      m->entry.file_type = "F32";
      m->entry.parameter_size = "260K";
      m->entry.file_bytes = 1000;
      m->bytes = 4000;
      m->metadata = {{"general.architecture", "llama"}, {"tokenizer.chat_template", "{{ messages }}"}};
      models_.push_back(std::move(m));
    }
    if (with_variant) {
      models_[0]->entry.defaults.chat_template = "{{ alpha's own }}";
      variant_ = models_[0]->entry;
      variant_.name = "alpha-brief";
      variant_.parent = "alpha";
      variant_.defaults = {};
      variant_.defaults.adapters = {AdapterSpec{"/models/lora/brief.gguf", 0.5f}};
    }
  }
  Acquired acquire(const std::string& requested, std::optional<double> keep_alive_s) override {
    std::lock_guard lock(mu_);
    last_keep_alive_ = keep_alive_s;
    // Ollama's clients add ":latest" (as the pool, tools/serve_models, resolves it).
    const std::string name = requested.ends_with(":latest") ? requested.substr(0, requested.size() - 7) : requested;
    for (auto& m : models_)
      if (m->id == name) {
        ++acquires_[name];
        return {m, 7};
      }
    if (name.empty()) throw ApiError(400, "invalid_request_error", "model", "", "model is required");
    throw ApiError(404, "invalid_request_error", "model", "model_not_found", "The model `" + name + "` does not exist.");
  }
  bool serves(const std::string& name) const override { return name == "alpha" || name == "beta"; }
  void unload(const std::string& name) override {
    if (!serves(name)) throw ApiError(404, "invalid_request_error", "model", "model_not_found", "no " + name);
    std::lock_guard lock(mu_);
    ++unloads_[name];
  }
  Description describe(const std::string& name) const override {
    if (!variant_.name.empty() && name == variant_.name) return {variant_, models_[0]->metadata};
    for (const auto& m : models_)
      if (m->id == name) return {m->entry, m->metadata};
    throw ApiError(404, "invalid_request_error", "model", "model_not_found", "no " + name);
  }
  std::vector<ModelEntry> models() const override {
    std::vector<ModelEntry> out = {models_[0]->entry, models_[1]->entry};
    if (!variant_.name.empty()) out.push_back(variant_);
    return out;
  }
  std::vector<LoadedModelInfo> loaded() const override {
    LoadedModelInfo a;
    a.entry = models_[0]->entry;
    a.bytes = 4000;
    a.n_ctx = 256;
    a.expires = std::chrono::system_clock::time_point(std::chrono::seconds(4102444800));  // 2100-01-01
    return {a};
  }
  EngineMetrics metrics() const override { return backends_[0]->metrics(); }
  int64_t n_ctx_of(const std::string&) const override { return 256; }

  int acquires(const std::string& n) {
    std::lock_guard lock(mu_);
    return acquires_[n];
  }
  int unloads(const std::string& n) {
    std::lock_guard lock(mu_);
    return unloads_[n];
  }
  std::optional<double> last_keep_alive() {
    std::lock_guard lock(mu_);
    return last_keep_alive_;
  }
  FakeBackend& backend(int i) { return *backends_[size_t(i)]; }

 private:
  std::vector<std::unique_ptr<FakeBackend>> backends_;
  std::vector<std::shared_ptr<ServedModel>> models_;
  std::mutex mu_;
  std::map<std::string, int> acquires_, unloads_;
  std::optional<double> last_keep_alive_;
  ModelEntry variant_;  // name "" : none
};

struct Fixture {
  explicit Fixture(bool with_variant = false) : provider(with_variant), server(provider, config()) {
    server.start();
    client = std::make_unique<httplib::Client>("127.0.0.1", server.port());
    client->set_read_timeout(20, 0);
  }
  static ServerConfig config() {
    ServerConfig c;
    c.port = 0;
    c.http_threads = 32;
    c.max_in_flight = 64;
    c.version = "9.9.9";
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client->Post(path, body, "application/json");
  }
  json post_json(const std::string& path, const json& body, int want_status = 200) {
    auto r = post(path, body.dump());
    EXPECT_TRUE(r) << "no response for " << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << path << " " << body.dump() << " -> " << r->body;
    return json::parse(r->body);
  }
  // A streamed answer: its NDJSON lines, parsed.
  std::vector<json> post_lines(const std::string& path, const json& body) {
    auto r = post(path, body.dump());
    EXPECT_TRUE(r);
    std::vector<json> lines;
    if (!r) return lines;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(json::parse(line));
    return lines;
  }

  TwoModels provider;
  Server server;
  std::unique_ptr<httplib::Client> client;
};

std::string ollama_error(const httplib::Result& r, int status) {
  EXPECT_TRUE(r);
  if (!r) return "";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error") && j["error"].is_string()) << r->body;
  return j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "";
}

const json kGreedy = {{"temperature", 0}, {"num_predict", 12}};

}  // namespace

TEST(OllamaHttp, EachRequestIsAnsweredByTheModelItNames) {
  Fixture f;
  const json a = f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "x"}, {"stream", false}, {"options", kGreedy}});
  const json b = f.post_json("/api/generate", {{"model", "beta"}, {"prompt", "x"}, {"stream", false}, {"options", kGreedy}});
  EXPECT_EQ(a["model"], "alpha");
  EXPECT_EQ(a["response"], kAlphaScript.substr(0, 12));
  EXPECT_EQ(b["model"], "beta");
  EXPECT_EQ(b["response"], kBetaScript.substr(0, 12));
  EXPECT_EQ(a["done"], true);
  EXPECT_EQ(a["done_reason"], "length");
  EXPECT_EQ(a["eval_count"], 12);
  EXPECT_EQ(a["load_duration"], 7);
  EXPECT_GE(a["total_duration"].get<int64_t>(), a["eval_duration"].get<int64_t>());
  // OpenAI's routes choose by "model" too.
  const json c = f.post_json("/v1/completions", {{"model", "beta"}, {"prompt", "x"}, {"max_tokens", 5}});
  EXPECT_EQ(c["model"], "beta");
  EXPECT_EQ(c["choices"][0]["text"], kBetaScript.substr(0, 5));
  const json chat = f.post_json("/v1/chat/completions",
                                {{"model", "alpha"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}});
  EXPECT_EQ(chat["model"], "alpha");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], kAlphaScript.substr(0, 4));
  // /v1/models lists both.
  const json models = json::parse(f.client->Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "beta");
  EXPECT_EQ(f.client->Get("/v1/models/beta")->status, 200);
  EXPECT_EQ(f.client->Get("/v1/models/gamma")->status, 404);
  // /metrics by model: the requests each answered, and which is loaded.
  const std::string metrics = f.client->Get("/metrics")->body;
  EXPECT_NE(metrics.find("tern_model_requests_total{model=\"alpha\",status=\"200\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_requests_total{model=\"beta\",status=\"200\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_generation_tokens_total{model=\"beta\"} 17"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_loaded{model=\"alpha\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_loaded{model=\"beta\"} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_memory_bytes{model=\"alpha\"} 4000"), std::string::npos) << metrics;
}

TEST(OllamaHttp, ChatWholeAndStreamedAgree) {
  Fixture f;
  const json body = {{"model", "beta"}, {"messages", {{{"role", "user"}, {"content", "tell"}}}}, {"options", kGreedy}};
  json whole_body = body;
  whole_body["stream"] = false;
  const json whole = f.post_json("/api/chat", whole_body);
  EXPECT_EQ(whole["message"]["role"], "assistant");
  EXPECT_EQ(whole["message"]["content"], kBetaScript.substr(0, 12));
  EXPECT_EQ(whole["done"], true);
  EXPECT_TRUE(whole["created_at"].get<std::string>().find('T') != std::string::npos);
  // Ollama streams unless told not to.
  const std::vector<json> lines = f.post_lines("/api/chat", body);
  ASSERT_GE(lines.size(), 2u);
  std::string text;
  int64_t eval_count = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], false);
    EXPECT_EQ(lines[i]["done_reason"], "");
    text += lines[i]["message"]["content"].get<std::string>();
    // The running figures: tokens so far, never going back.
    EXPECT_GE(lines[i]["eval_count"].get<int64_t>(), eval_count);
    eval_count = lines[i]["eval_count"];
    EXPECT_GT(lines[i]["prompt_eval_count"].get<int64_t>(), 0);
  }
  EXPECT_GT(eval_count, 0);
  EXPECT_EQ(text, whole["message"]["content"]);
  const json& last = lines.back();
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "length");
  EXPECT_EQ(last["eval_count"], 12);
  EXPECT_TRUE(last.contains("prompt_eval_count"));
  // Ollama echoes the model name as the request gave it, on every line.
  json latest = body;
  latest["model"] = "beta:latest";
  for (const json& line : f.post_lines("/api/chat", latest)) EXPECT_EQ(line["model"], "beta:latest");
  latest["stream"] = false;
  EXPECT_EQ(f.post_json("/api/chat", latest)["model"], "beta:latest");
}

TEST(OllamaHttp, OptionsReachTheEngine) {
  Fixture f;
  f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "x"}, {"stream", false},
                                {"options", {{"temperature", 0.25}, {"top_k", 7}, {"top_p", 0.5}, {"seed", 11},
                                             {"num_predict", 3}, {"stop", {"zz"}}, {"num_ctx", 4096}}}});
  const RequestParams p = f.provider.backend(0).last_params();
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.25f);
  EXPECT_EQ(p.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.seed, 11u);
  EXPECT_EQ(p.max_tokens, 3);
  EXPECT_EQ(p.stop, std::vector<std::string>{"zz"});
  // Ollama's defaults where the request sets nothing; no num_predict: to the context's end.
  f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "x"}, {"stream", false}, {"raw", true}});
  const RequestParams d = f.provider.backend(0).last_params();
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.8f);
  EXPECT_EQ(d.sampling.top_k, 40);
  EXPECT_EQ(d.max_tokens, 256 - 2);  // BOS + "x" in a context of 256
}

TEST(OllamaHttp, GenerateContextContinuesTheConversation) {
  Fixture f;
  const json first = f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "ab"}, {"raw", true},
                                                   {"stream", false}, {"options", {{"num_predict", 4}}}});
  // Raw prompt: BOS, 'a', 'b', then the four answer tokens.
  const std::vector<int32_t> ctx = first["context"].get<std::vector<int32_t>>();
  ASSERT_EQ(ctx.size(), 7u);
  EXPECT_EQ(ctx[0], 1);
  EXPECT_EQ(ctx[1], 3 + 'a');
  EXPECT_EQ(ctx[3], 3 + 'a');  // the answer's first byte ("alpha...")
  f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "c"}, {"raw", true}, {"context", ctx},
                                {"stream", false}, {"options", {{"num_predict", 2}}}});
  std::vector<int32_t> want = ctx;
  want.push_back(3 + 'c');  // no second BOS after a context
  EXPECT_EQ(f.provider.backend(0).last_params().prompt_ids, want);
  // Streamed, the last line carries the context too.
  const auto lines = f.post_lines("/api/generate", {{"model", "alpha"}, {"prompt", "ab"}, {"raw", true},
                                                    {"options", {{"num_predict", 4}}}});
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["context"].get<std::vector<int32_t>>(), ctx);
  // A context id outside the vocabulary is the client's error.
  EXPECT_NE(ollama_error(f.post("/api/generate", R"({"model":"alpha","prompt":"x","context":[999999]})"), 400)
                .find("vocabulary"),
            std::string::npos);
}

TEST(OllamaHttp, LoadAndUnloadRequests) {
  Fixture f;
  const json load = f.post_json("/api/generate", {{"model", "beta"}, {"keep_alive", -1}});
  EXPECT_EQ(load["done_reason"], "load");
  EXPECT_EQ(load["response"], "");
  EXPECT_EQ(f.provider.acquires("beta"), 1);
  EXPECT_EQ(f.provider.last_keep_alive(), -1.0);
  const json unload = f.post_json("/api/chat", {{"model", "beta"}, {"messages", json::array()}, {"keep_alive", 0}});
  EXPECT_EQ(unload["done_reason"], "unload");
  EXPECT_EQ(f.provider.unloads("beta"), 1);
  EXPECT_EQ(f.provider.acquires("beta"), 1);  // unloading loads nothing
  // A duration string reaches the provider in seconds.
  f.post_json("/api/generate", {{"model", "alpha"}, {"prompt", "x"}, {"stream", false}, {"keep_alive", "1m30s"},
                                {"options", {{"num_predict", 1}}}});
  EXPECT_EQ(f.provider.last_keep_alive(), 90.0);
}

TEST(OllamaHttp, ListingRoutes) {
  Fixture f;
  const json tags = json::parse(f.client->Get("/api/tags")->body);
  ASSERT_EQ(tags["models"].size(), 2u);
  EXPECT_EQ(tags["models"][0]["name"], "alpha");
  EXPECT_EQ(tags["models"][0]["details"]["format"], "gguf");
  EXPECT_EQ(tags["models"][0]["details"]["quantization_level"], "F32");
  const json ps = json::parse(f.client->Get("/api/ps")->body);
  ASSERT_EQ(ps["models"].size(), 1u);
  EXPECT_EQ(ps["models"][0]["size"], 4000);
  EXPECT_EQ(ps["models"][0]["context_length"], 256);
  EXPECT_EQ(json::parse(f.client->Get("/api/version")->body)["version"], "9.9.9");
  const int acquired = f.provider.acquires("beta");
  const json show = f.post_json("/api/show", {{"model", "beta"}});
  EXPECT_EQ(f.provider.acquires("beta"), acquired);  // shown from the header, not loaded
  EXPECT_EQ(show["template"], "{{ messages }}");
  EXPECT_EQ(show["details"]["family"], "llama");
  EXPECT_EQ(show["model_info"]["general.architecture"], "llama");
}

// A models.json variant runs on its base's engine: listed loaded with it (its memory counted
// once, on the base), shown with its base's template and a Modelfile naming its adapter.
TEST(OllamaHttp, VariantGoesWithItsBase) {
  Fixture f(/*with_variant=*/true);
  const json tags = json::parse(f.client->Get("/api/tags")->body);
  ASSERT_EQ(tags["models"].size(), 3u);
  std::map<std::string, json> by_name;
  for (const json& m : tags["models"]) by_name[m["name"].get<std::string>()] = m;
  EXPECT_EQ(by_name["alpha"]["expires_at"], "2100-01-01T00:00:00Z");
  EXPECT_EQ(by_name["alpha-brief"]["expires_at"], "2100-01-01T00:00:00Z");
  EXPECT_EQ(by_name["beta"]["expires_at"], "0001-01-01T00:00:00Z");
  EXPECT_EQ(by_name["alpha-brief"]["details"]["parent_model"], "alpha");

  const std::string metrics = f.client->Get("/metrics")->body;
  EXPECT_NE(metrics.find("tern_model_loaded{model=\"alpha-brief\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_memory_bytes{model=\"alpha\"} 4000"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_memory_bytes{model=\"alpha-brief\"} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tern_model_loaded{model=\"beta\"} 0"), std::string::npos) << metrics;

  const json show = f.post_json("/api/show", {{"model", "alpha-brief"}});
  EXPECT_EQ(show["template"], "{{ alpha's own }}");  // the base's models.json template, not the file's
  const std::string modelfile = show["modelfile"];
  EXPECT_NE(modelfile.find("# tern: adapter scale 0.5\nADAPTER /models/lora/brief.gguf\n"), std::string::npos)
      << modelfile;
  EXPECT_EQ(f.post_json("/api/show", {{"model", "beta"}})["template"], "{{ messages }}");
}

TEST(OllamaHttp, EmbedReturnsTheModelsVectors) {
  Fixture f;
  const json e = f.post_json("/api/embed", {{"model", "beta"}, {"input", {"ab", "c"}}});
  ASSERT_EQ(e["embeddings"].size(), 2u);
  EXPECT_EQ(e["model"], "beta");
  const auto want = FakeBackend::fake_embedding({1, 3 + 'a', 3 + 'b'}, 8);
  const auto got = e["embeddings"][0].get<std::vector<float>>();
  ASSERT_EQ(got.size(), want.size());
  // /api/embed's vectors are the engine's, L2-normalized (as Ollama's).
  double nw = 0;
  for (const float x : want) nw += double(x) * x;
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k] / std::sqrt(nw), 1e-6) << k;
  // dimensions: cut, then normalized again.
  const json cut = f.post_json("/api/embed", {{"model", "beta"}, {"input", "ab"}, {"dimensions", 3}});
  const auto got3 = cut["embeddings"][0].get<std::vector<float>>();
  ASSERT_EQ(got3.size(), 3u);
  const double n3 = std::sqrt(double(want[0]) * want[0] + double(want[1]) * want[1] + double(want[2]) * want[2]);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(got3[k], want[k] / n3, 1e-6) << k;
  // The older /api/embeddings gives the engine's vector as it is.
  const json legacy = f.post_json("/api/embeddings", {{"model", "beta"}, {"prompt", "ab"}});
  ASSERT_EQ(legacy["embedding"].size(), 8u);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_FLOAT_EQ(legacy["embedding"][k].get<float>(), want[k]) << k;
  // The model name is echoed as the request gave it.
  EXPECT_EQ(f.post_json("/api/embed", {{"model", "beta:latest"}, {"input", "ab"}})["model"], "beta:latest");
}

TEST(OllamaHttp, ErrorsAreOllamaShaped) {
  Fixture f;
  std::string m = ollama_error(f.post("/api/chat", R"({"model":"gamma","messages":[{"role":"user","content":"x"}]})"), 404);
  EXPECT_NE(m.find("\"gamma\" not found"), std::string::npos) << m;
  EXPECT_NE(m.find("alpha"), std::string::npos) << m;  // names what is served
  m = ollama_error(f.post("/api/generate", R"({"prompt":"x"})"), 400);
  EXPECT_NE(m.find("model is required"), std::string::npos) << m;
  m = ollama_error(f.post("/api/generate", R"({"model":"alpha","prompt":"x","options":{"temperature":"hot"}})"), 400);
  EXPECT_NE(m.find("temperature"), std::string::npos) << m;
  m = ollama_error(f.post("/api/chat", R"({"model":"alpha","messages":[{"role":"user","content":"x","images":["aGk="]}]})"), 400);
  EXPECT_NE(m.find("images"), std::string::npos) << m;
  ollama_error(f.post("/api/chat", "{not json"), 400);
  ollama_error(f.post("/api/show", R"({"model":"nope"})"), 404);
  ollama_error(f.post("/api/chat", R"({"model":"nope","messages":[],"keep_alive":0})"), 404);
  m = ollama_error(f.post("/api/pull", R"({"model":"llama3"})"), 501);
  EXPECT_NE(m.find("models directory"), std::string::npos) << m;
  // A prompt over the context is refused before anything runs.
  const std::string long_prompt(400, 'x');
  ollama_error(f.post("/api/generate", json{{"model", "alpha"}, {"prompt", long_prompt}, {"raw", true}}.dump()), 400);
  // Errors the HTTP layer answers itself are Ollama-shaped under /api/ too.
  m = ollama_error(f.client->Get("/api/nothing-here"), 404);
  EXPECT_NE(m.find("/api/nothing-here"), std::string::npos) << m;
  ollama_error(f.client->Get("/api/chat"), 405);
  ollama_error(f.post("/api/chat", std::string((size_t(8) << 20) + 1, ' ')), 413);
  // ... and OpenAI-shaped elsewhere.
  auto openai = f.client->Get("/v1/nothing-here");
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 404);
  EXPECT_TRUE(json::parse(openai->body)["error"].is_object()) << openai->body;
  // After all of that, both models still answer.
  EXPECT_EQ(f.post_json("/api/generate", {{"model", "beta"}, {"prompt", "x"}, {"stream", false}, {"options", kGreedy}})["response"],
            kBetaScript.substr(0, 12));
}

TEST(OllamaHttp, ConcurrentRequestsOverBothModelsStayApart) {
  Fixture f;
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int i = 0; i < 16; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", f.server.port());
      c.set_read_timeout(20, 0);
      const std::string name = i % 2 ? "beta" : "alpha";
      const bool stream = i % 4 >= 2;
      json body = {{"model", name}, {"prompt", "x"}, {"stream", stream}, {"options", kGreedy}};
      auto r = c.Post("/api/generate", body.dump(), "application/json");
      if (!r || r->status != 200) return;
      std::string text;
      std::istringstream in(r->body);
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) text += json::parse(line)["response"].get<std::string>();
      if (text == (i % 2 ? kBetaScript : kAlphaScript).substr(0, 12)) ++right;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(right.load(), 16);
}

}  // namespace test_ollama_http
