// Speculative decoding behind the server (docs/server.md, "Speculative decoding"): a
// `tern serve --lookup 3` process answers greedy completions and chats with the text of a server
// without a drafter, and its /metrics shows the spec series with drafts accepted; in-process,
// "speculative": false (OpenAI) and options.speculative false (Ollama) decode a request plainly
// with the same text, and a non-boolean is a 400 naming the field; with several models
// (--models DIR), --draft applies to each, and one whose vocabulary it does not share fails to
// load with the reason while the others draft.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "models/model.h"
#include "server/backend.h"
#include "server/server.h"
#include "server/serve_process.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace test_server_spec {

using namespace tern;
using namespace tern::server;
using namespace tern::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kModel = "models/stories260K.gguf";

// An in-process server on stories260K, with `spec` as its engine's drafter.
struct InProcess {
  explicit InProcess(const SpecConfig& spec = {}) {
    file = open_model_file(shared_path(kModel), "");
    tok = Tokenizer::from_gguf(*file);
    EngineConfig ec;
    ec.n_threads = 1;
    ec.n_ctx = 256;
    ec.n_parallel = 4;
    ec.kv_type = KvType::F16;  // `tern serve`'s default: its process and this server agree
    ec.spec = spec;
    engine = std::make_unique<Engine>(file, tok, ec);
    backend = std::make_unique<EngineBackend>(*engine);
    ServerConfig sc;
    sc.port = 0;
    sc.model_id = "stories260K";
    sc.http_threads = 8;
    server = std::make_unique<Server>(*backend, sc);
    server->start();
    engine->start();
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(60, 0);
  }
  ~InProcess() {
    server->shutdown(0ms);
    engine->stop();
  }

  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
};

json post(httplib::Client& c, const std::string& path, const json& body, int want = 200) {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, want) << path << " " << body.dump() << " -> " << r->body;
  try {
    return json::parse(r->body);
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON: " << r->body;
    return json();
  }
}

// The value of an unlabelled sample `name` in Prometheus text (-1 when absent).
double sample(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("(^|\n)" + name + " ([^\n]+)\n"))) return -1;
  return std::stod(m[2]);
}

// Story openings: what the model continues, and repeats itself in (what lookup drafts from).
const std::vector<std::string> kPrompts = {"Once upon a time, there was a little girl named Lily.",
                                           "Tom had a big red ball. He liked to play with it",
                                           "One day, a cat and a dog went to the park."};

json completion_body(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 64}, {"temperature", 0}, {"ignore_eos", true}};
}
json chat_body(const std::string& text) {
  return {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 48}, {"temperature", 0}};
}

}  // namespace

TEST(ServerSpec, LookupServerAnswersGreedyWithThePlainTextAndReportsAcceptance) {
  TERN_REQUIRE_SHARED(kModel);
  InProcess plain;
  ServeProcess spec({"-m", shared_path(kModel), "--lookup", "3"});
  ASSERT_GT(spec.port(), 0) << spec.log();
  EXPECT_NE(spec.log().find("speculative decoding: prompt lookup"), std::string::npos) << spec.log();
  httplib::Client sc("127.0.0.1", spec.port());
  sc.set_read_timeout(60, 0);
  for (const std::string& p : kPrompts) {
    const json a = post(*plain.client, "/v1/completions", completion_body(p));
    const json b = post(sc, "/v1/completions", completion_body(p));
    EXPECT_EQ(b["choices"][0]["text"], a["choices"][0]["text"]) << p;
    EXPECT_EQ(b["usage"], a["usage"]) << p;
    const json ca = post(*plain.client, "/v1/chat/completions", chat_body(p));
    const json cb = post(sc, "/v1/chat/completions", chat_body(p));
    EXPECT_EQ(cb["choices"][0]["message"]["content"], ca["choices"][0]["message"]["content"]) << p;
  }
  auto r = sc.Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const double drafted = sample(r->body, "tern_spec_draft_tokens_total");
  const double accepted = sample(r->body, "tern_spec_accepted_tokens_total");
  const double steps = sample(r->body, "tern_spec_verify_steps_total");
  const double rate = sample(r->body, "tern_spec_acceptance_rate");
  const double length = sample(r->body, "tern_spec_mean_accepted_length");
  EXPECT_GT(drafted, 0) << r->body;
  EXPECT_GT(accepted, 0) << r->body;
  EXPECT_GT(steps, 0) << r->body;
  EXPECT_LE(accepted, drafted);
  EXPECT_GT(rate, 0);
  EXPECT_NEAR(rate, accepted / drafted, 1e-9);
  EXPECT_NEAR(length, (accepted + steps) / steps, 1e-9);
  EXPECT_GT(length, 1.0);

  // A server without a drafter exposes the series too, at 0.
  auto z = plain.client->Get("/metrics");
  ASSERT_TRUE(z);
  EXPECT_EQ(sample(z->body, "tern_spec_draft_tokens_total"), 0) << z->body;
  EXPECT_EQ(sample(z->body, "tern_spec_acceptance_rate"), 0) << z->body;
  EXPECT_EQ(sample(z->body, "tern_spec_mean_accepted_length"), 0) << z->body;
}

TEST(ServerSpec, BadSpecFlagsStopTheServerNamingThem) {
  TERN_REQUIRE_SHARED(kModel);
  std::string out, err;
  const std::string serve = std::string(TERN_BINARY) + " serve -m " + shared_path(kModel) + " --port 0";
  EXPECT_EQ(run_command(serve + " --lookup 2 --draft " + shared_path(kModel), &out, &err), 1);
  EXPECT_NE(err.find("--lookup"), std::string::npos) << err;
  EXPECT_NE(err.find("--draft"), std::string::npos) << err;
  EXPECT_EQ(run_command(serve + " --draft /nonexistent/draft.gguf", &out, &err), 1);
  EXPECT_NE(err.find("--draft"), std::string::npos) << err;
  EXPECT_EQ(run_command(serve + " --lookup 17", &out, &err), 1);
  EXPECT_NE(err.find("--lookup"), std::string::npos) << err;
}

TEST(ServerSpec, RequestsOptOutWithTheSameTextAndNonBooleansAre400) {
  TERN_REQUIRE_SHARED(kModel);
  SpecConfig spec;
  spec.source = DraftSource::Lookup;
  spec.ngram.ngram_max = 3;
  InProcess f(spec);
  const std::string p = kPrompts[0];
  const json drafted = post(*f.client, "/v1/completions", completion_body(p));
  const json chat_drafted = post(*f.client, "/v1/chat/completions", chat_body(p));
  const EngineMetrics after_drafted = f.engine->metrics();
  EXPECT_GT(after_drafted.spec_drafted, 0);

  // Opted out: the same text, and nothing more drafted (the engine's counters stand still).
  json body = completion_body(p);
  body["speculative"] = false;
  const json plain = post(*f.client, "/v1/completions", body);
  EXPECT_EQ(plain["choices"][0]["text"], drafted["choices"][0]["text"]);
  json cbody = chat_body(p);
  cbody["speculative"] = false;
  const json chat_plain = post(*f.client, "/v1/chat/completions", cbody);
  EXPECT_EQ(chat_plain["choices"][0]["message"]["content"], chat_drafted["choices"][0]["message"]["content"]);
  const json ollama_plain = post(*f.client, "/api/generate",
                                 {{"model", "stories260K"}, {"prompt", p}, {"stream", false},
                                  {"options", {{"temperature", 0}, {"num_predict", 32}, {"speculative", false}}}});
  EXPECT_FALSE(ollama_plain["response"].get<std::string>().empty());
  EXPECT_EQ(f.engine->metrics().spec_drafted, after_drafted.spec_drafted);

  // Ollama's options.speculative true (the default) drafts: the same answer as opted out.
  const json ollama_spec = post(*f.client, "/api/generate",
                                {{"model", "stories260K"}, {"prompt", p}, {"stream", false},
                                 {"options", {{"temperature", 0}, {"num_predict", 32}, {"speculative", true}}}});
  EXPECT_EQ(ollama_spec["response"], ollama_plain["response"]);

  // Not a boolean: 400 naming the field, OpenAI's shape and Ollama's.
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json bad = std::string(path) == "/v1/completions" ? completion_body(p) : chat_body(p);
    bad["speculative"] = "no";
    const json e = post(*f.client, path, bad, 400);
    EXPECT_EQ(e["error"]["param"], "speculative") << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find("speculative"), std::string::npos) << e.dump();
  }
  for (const char* path : {"/api/generate", "/api/chat"}) {
    json bad = {{"model", "stories260K"}, {"stream", false}, {"options", {{"speculative", "no"}}}};
    if (std::string(path) == "/api/generate") bad["prompt"] = p;
    else bad["messages"] = json::array({{{"role", "user"}, {"content", p}}});
    const json e = post(*f.client, path, bad, 400);
    EXPECT_NE(e["error"].get<std::string>().find("\"speculative\""), std::string::npos) << e.dump();
  }
}

TEST(ServerSpec, ADraftThatDoesNotFitAModelOfSeveralFailsItsLoadsWithTheReason) {
  TERN_REQUIRE_SHARED(kModel);
  TERN_REQUIRE_SHARED("models/llama-2-tiny-random.gguf");
  const std::string dir = make_temp_dir("tern_serve_spec_models");
  std::filesystem::create_symlink(shared_path(kModel), dir + "/stories260K.gguf");
  std::filesystem::create_symlink(shared_path("models/llama-2-tiny-random.gguf"), dir + "/tiny-random.gguf");
  {
    // tern-stories shares stories260K's 512-token vocabulary, not tiny-random's 32000.
    ServeProcess srv({"--models", dir, "--draft", std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf"});
    ASSERT_GT(srv.port(), 0) << srv.log();
    EXPECT_NE(srv.log().find("tiny-random: warning: --draft cannot draft for it"), std::string::npos) << srv.log();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    const json bad = post(c, "/v1/completions", {{"model", "tiny-random"}, {"prompt", "hi"}, {"max_tokens", 4}}, 500);
    EXPECT_EQ(bad["error"]["code"], "model_load_failed") << bad.dump();
    const std::string why = bad["error"]["message"].get<std::string>();
    EXPECT_NE(why.find("draft model"), std::string::npos) << why;
    EXPECT_NE(why.find("32000"), std::string::npos) << why;
    json body = completion_body(kPrompts[0]);
    body["model"] = "stories260K";
    const json good = post(c, "/v1/completions", body);
    EXPECT_EQ(good["usage"]["completion_tokens"], 64);
    auto r = c.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_GT(sample(r->body, "tern_spec_draft_tokens_total"), 0) << r->body;
    EXPECT_GT(sample(r->body, "tern_spec_acceptance_rate"), 0) << r->body;
  }
  remove_temp_dir(dir);
}

}  // namespace test_server_spec
