// Interoperability: llama.cpp (the peer installed by shared/peer/setup.sh) must load GGUF files
// that tern writes and generate the same greedy tokens as llama2.c's reference run.
// Skips when the peer or node is not installed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iostream>
#include <sstream>

#include "gguf_test_util.h"
#include "models/llama2c_import.h"
#include "models/lora.h"

#include <cmath>
#include <random>

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test::test_llamacpp_peer {
namespace {

const std::string kModel = "models/stories260K.gguf";
const std::string kBin = "models/stories260K-llama2c/stories260K.bin";
const std::string kTok = "models/stories260K-llama2c/tok512.bin";
const std::string kRef = "reference/stories260K/greedy_prompt_once_upon_a_time_n64.tokens";
constexpr int kNew = 8;  // tokens generated

std::string peer_script() {
  const char* dir = std::getenv("PEER_DIR");
  const char* home = std::getenv("HOME");
  const std::string peer = dir ? dir : std::string(home ? home : "") + "/.cache/llamacpp-peer";
  if (!std::filesystem::exists(peer + "/node_modules/node-llama-cpp")) return "";
  const std::string script = peer + "/llamacpp_bench.mjs";
  return std::filesystem::exists(script) ? script : "";
}

bool have_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string d; std::getline(ss, d, ':');)
    if (!d.empty() && access((d + "/" + name).c_str(), X_OK) == 0) return true;
  return false;
}

// The reference run's prompt and its first kNew greedy continuations ("pos input next" lines;
// the prompt is positions 0..4, so the continuation is `next` from position 4 on).
struct Reference {
  std::vector<int> prompt, next;
};
Reference read_reference(size_t prompt_len) {
  std::ifstream in(shared_path(kRef));
  Reference r;
  int pos, input, next;
  while (in >> pos >> input >> next) {
    if (size_t(pos) < prompt_len) r.prompt.push_back(input);
    if (size_t(pos) + 1 >= prompt_len && r.next.size() < size_t(kNew)) r.next.push_back(next);
  }
  return r;
}

#define REQUIRE_PEER()                                                                                  \
  const std::string script = peer_script();                                                             \
  if (script.empty())                                                                                   \
    GTEST_SKIP() << "llama.cpp peer not installed (run ../shared/peer/setup.sh; PEER_DIR or "           \
                    "~/.cache/llamacpp-peer)";                                                          \
  if (!have_program("node")) GTEST_SKIP() << "node not found in PATH";                                  \
  for (const auto& rel : {kModel, kBin, kTok, kRef})                                                    \
    if (!std::filesystem::exists(shared_path(rel))) GTEST_SKIP() << "missing " << shared_path(rel)

// llama.cpp's greedy decode of "Once upon a time" (n tokens) on `gguf`: the JSON the peer prints.
void llamacpp_greedy(const std::string& script, const std::string& gguf, int n, nlohmann::json* j) {
  std::vector<std::string> argv = {"node", script, "--model", gguf, "--greedy", "Once upon a time",
                                   "--n", std::to_string(n), "--bos"};
  if (have_program("timeout")) argv.insert(argv.begin(), {"timeout", "300"});
  const RunResult r = run_program(argv);
  ASSERT_EQ(r.exit_code, 0) << "llama.cpp failed to load/run " << gguf << ":\n" << r.err << r.out;
  // The JSON is the last line of stdout.
  std::string last;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);)
    if (!line.empty()) last = line;
  try {
    *j = nlohmann::json::parse(last);
  } catch (const std::exception& e) {
    FAIL() << "peer output is not JSON: " << r.out;
  }
}

// Runs llama.cpp's greedy decode on `gguf` and checks it against the reference run.
void expect_llamacpp_matches_reference(const std::string& script, const std::string& gguf) {
  nlohmann::json j;
  llamacpp_greedy(script, gguf, kNew, &j);
  if (::testing::Test::HasFatalFailure()) return;
  const Reference ref = read_reference(5);
  ASSERT_EQ(ref.prompt, (std::vector<int>{1, 403, 407, 261, 378}));
  ASSERT_EQ(ref.next.size(), size_t(kNew));
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), ref.prompt);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), ref.next) << "llama.cpp text: " << j["text"];
  std::cout << "[ llama.cpp] " << gguf << ": ids " << j["ids"].dump() << " text " << j["text"].dump() << "\n";
}

TEST(LlamaCppPeer, LoadsTheLlama2cConversion) {
  REQUIRE_PEER();
  TempDir dir;
  const std::string out = dir.file("stories260K-from-llama2c.gguf");
  GgufWriter::write_bytes(out, llama2c_to_gguf_bytes(shared_path(kBin), shared_path(kTok)));
  expect_llamacpp_matches_reference(script, out);
}

// The shared model rewritten by GgufWriter with a layout llama.cpp never produced: tensors in
// reverse order, fresh offsets, and a 64-byte alignment recorded in general.alignment.
TEST(LlamaCppPeer, LoadsARelaidOutFile) {
  REQUIRE_PEER();
  const GgufFile src = GgufFile::open(shared_path(kModel));
  GgufWriter w;
  w.copy_metadata(src);
  w.set("general.alignment", GgufValue::u32(64));
  for (auto it = src.tensors().rbegin(); it != src.tensors().rend(); ++it)
    w.add_tensor(it->name, it->type, it->ne, it->data, it->n_bytes);
  TempDir dir;
  const std::string out = dir.file("stories260K-relaid.gguf");
  w.write(out);
  const GgufFile check = GgufFile::open(out);
  ASSERT_EQ(check.alignment(), 64u);
  ASSERT_EQ(check.tensors().front().name, src.tensors().back().name);
  expect_llamacpp_matches_reference(script, out);
}

// A checkpoint `tern train` writes (here: stories260K continued for 0 steps, so the weights are
// the reference run's) loads in llama.cpp and gives the reference tokens.
TEST(LlamaCppPeer, LoadsATernTrainCheckpoint) {
  REQUIRE_PEER();
  TempDir dir;
  const std::string data = dir.file("d.txt"), out = dir.file("trained.gguf");
  { std::ofstream(data) << "Once upon a time there was a cat. The cat sat on the mat all day long and was happy.\n"; }
  const RunResult r = run_tern({"train", "-m", shared_path(kModel), "--data", data, "--ctx", "8", "--batch", "1",
                                "--steps", "0", "-q", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_llamacpp_matches_reference(script, out);
}

// The default model tern trained (models/tern-stories.gguf, Q8_0): llama.cpp's greedy tokens
// equal tern's.
TEST(LlamaCppPeer, RunsTheDefaultModelAsTernDoes) {
  REQUIRE_PEER();
  const std::string model = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";
  nlohmann::json peer;
  llamacpp_greedy(script, model, 24, &peer);
  if (HasFatalFailure()) return;
  const RunResult r = run_tern({"run", "-m", model, "-p", "Once upon a time", "-n", "24", "--temp", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json ours = nlohmann::json::parse(r.out);
  EXPECT_EQ(peer["prompt_ids"], ours["prompt_ids"]);
  EXPECT_EQ(peer["ids"], ours["ids"]) << "llama.cpp: " << peer["text"] << "\ntern: " << ours["text"];
}

// A LoRA adapter tern writes (every attention and FFN matrix and the output, rank 4, alpha 8)
// loads in llama.cpp, and its greedy tokens with the adapter at scale 0.7 equal tern's; the
// model `tern lora merge` writes gives the same tokens without the adapter, in both.
TEST(LlamaCppPeer, LoadsATernLoraAdapterAndAgreesWithTern) {
  REQUIRE_PEER();
  const GgufFile base = GgufFile::open(shared_path(kModel));
  std::mt19937 rng(2024);
  std::vector<LoraPair> pairs;
  for (const GgufTensorInfo& t : base.tensors()) {
    const bool layer = t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2 && t.name.find("norm") == std::string::npos;
    if (!layer && t.name != "output.weight") continue;
    LoraPair p;
    p.target = t.name;
    p.rank = 4;
    p.n_in = t.ne[0];
    p.n_out = t.ne[1];
    std::normal_distribution<float> na(0.0f, 1.0f / std::sqrt(float(p.n_in))), nb(0.0f, 0.04f);
    p.a.resize(size_t(p.rank * p.n_in));
    p.b.resize(size_t(p.rank * p.n_out));
    for (float& x : p.a) x = na(rng);
    for (float& x : p.b) x = nb(rng);
    pairs.push_back(std::move(p));
  }
  ASSERT_GE(pairs.size(), 7u);
  TempDir dir;
  const std::string adapter = dir.file("adapter.gguf"), merged = dir.file("merged.gguf");
  write_lora_adapter(adapter, "llama", 8.0f, pairs);
  const int n = 48;
  nlohmann::json peer, plain;
  {
    std::vector<std::string> argv = {"node", script, "--model", shared_path(kModel), "--greedy", "Once upon a time",
                                     "--n", std::to_string(n), "--bos", "--lora", adapter + ":0.7"};
    const RunResult r = run_program(argv);
    ASSERT_EQ(r.exit_code, 0) << "llama.cpp failed with the adapter:\n" << r.err << r.out;
    std::string last;
    std::stringstream ss(r.out);
    for (std::string line; std::getline(ss, line);)
      if (!line.empty()) last = line;
    peer = nlohmann::json::parse(last);
  }
  llamacpp_greedy(script, shared_path(kModel), n, &plain);
  if (HasFatalFailure()) return;
  EXPECT_NE(peer["ids"], plain["ids"]) << "the adapter should change llama.cpp's continuation";
  const RunResult r = run_tern({"run", "-m", shared_path(kModel), "--lora", adapter + ":0.7", "-p", "Once upon a time",
                                "-n", std::to_string(n), "--temp", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json ours = nlohmann::json::parse(r.out);
  EXPECT_EQ(peer["prompt_ids"], ours["prompt_ids"]);
  EXPECT_EQ(peer["ids"], ours["ids"]) << "llama.cpp: " << peer["text"] << "\ntern: " << ours["text"];
  // Merged: the same tokens in tern and in llama.cpp, without the adapter.
  const RunResult m = run_tern({"lora", "merge", "-m", shared_path(kModel), "--lora", adapter + ":0.7", "-o", merged});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const RunResult rm = run_tern({"run", "-m", merged, "-p", "Once upon a time", "-n", std::to_string(n), "--temp", "0",
                                 "--json"});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(nlohmann::json::parse(rm.out)["ids"], ours["ids"]);
  nlohmann::json peer_merged;
  llamacpp_greedy(script, merged, n, &peer_merged);
  if (HasFatalFailure()) return;
  EXPECT_EQ(peer_merged["ids"], peer["ids"]);
  std::cout << "[ llama.cpp] with the adapter: " << peer["text"] << "\n";
}

}  // namespace
}  // namespace tern::test::test_llamacpp_peer
