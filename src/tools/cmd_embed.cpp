// tern embed: sentence embeddings of texts through the serving engine (docs/embed.md): each input
// is an embedding request (engine/engine.h, EmbeddingParams), all submitted at once so many
// lines are batched into the same steps, with the tokenization of /v1/embeddings
// (server/embeddings_api.h), so both give the same vectors.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "engine/engine.h"
#include "server/embeddings_api.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"

namespace tern {
namespace {

// What one embedding request returned.
struct EmbedResult {
  bool done = false;
  FinishReason reason = FinishReason::None;
  std::string error;
  std::vector<float> v;
};

// .npy v1.0 of a little-endian float32 [rows, cols] C-order array.
std::string npy_bytes(const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  // Magic (6) + version (2) + header length (2) + header + '\n', padded to a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += char(header.size() & 0xff);
  out += char((header.size() >> 8) & 0xff);
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  return out;
}

}  // namespace

int cmd_embed(int argc, char** argv) {
  CLI::App app{"Embeddings of texts: pooled, normalised final hidden states of the model (batched through the engine)."};
  ModelArgs margs;
  margs.add_to(app);
  std::string prompt, input_file, pooling_text = "model", hidden_out;
  bool no_normalize = false, json_out = false;
  int64_t n_parallel = 4;
  app.add_option("-p,--prompt", prompt, "the text to embed");
  app.add_option("-f,--file", input_file, "a file of texts to embed, one per line (empty lines are skipped)");
  app.add_option("--pooling", pooling_text,
                 "mean, last, cls, or model: the file's <arch>.pooling_type, else mean")
      ->check(CLI::IsMember({"model", "mean", "last", "cls"}))
      ->capture_default_str();
  app.add_flag("--no-normalize", no_normalize, "print the pooled vectors as they are (default: L2-normalised)");
  app.add_flag("--json", json_out, "print {model, n_embd, pooling, normalized, data: [{index, tokens, embedding}]}");
  app.add_option("--hidden-states", hidden_out,
                 "also write every token's final hidden state (after the output norm, not normalised), all inputs' "
                 "rows one after another: OUT.npy (float32 [tokens, n_embd]) or raw little-endian float32");
  app.add_option("--parallel", n_parallel, "inputs the KV cache holds at once")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->capture_default_str();
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (prompt.empty() == input_file.empty()) fail("give one of -p TEXT or -f FILE");
  if (!hidden_out.empty()) {
    check_output_path(hidden_out);
    check_output_not_input(hidden_out, {margs.model, margs.tokenizer_bin, input_file});
  }

  std::vector<std::string> texts;
  if (!prompt.empty()) {
    texts.push_back(prompt);
  } else {
    const std::string all = read_file_text(input_file, "input file");
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      std::string line = all.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) texts.push_back(std::move(line));
      start = end + 1;
    }
    if (texts.empty()) fail(input_file, ": no lines to embed");
  }

  std::shared_ptr<const GgufFile> file = open_model_file(margs.model, margs.tokenizer_bin);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
  EngineConfig ecfg;
  ecfg.n_threads = margs.threads;
  ecfg.max_batch_tokens = margs.batch;
  ecfg.kv_type = kv_type_from_name(margs.kv_type);
  ecfg.n_parallel = n_parallel;
  ecfg.prefix_caching = false;  // embedding requests never use it
  ContextRequest ctx_req;
  ctx_req.kv_type = ecfg.kv_type;
  ctx_req.n_ctx = margs.ctx;
  ctx_req.n_parallel = n_parallel;
  ecfg.n_ctx = plan_model_context(*file, ctx_req, margs.command(), margs.ctx_given()).n_ctx;
  Engine engine(file, tokenizer, ecfg);
  const LoraSet lora = load_lora_args(margs.lora, *file);
  for (const LoraUse& u : lora) engine.check_lora(*u.adapter);
  const int64_t E = engine.n_embd();
  const Pooling pooling = pooling_text == "model" ? engine.default_pooling() : pooling_from_name(pooling_text);

  // Each input's tokens as /v1/embeddings makes them; too long an input is an error naming it.
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < texts.size(); ++i) {
    ids.push_back(server::embedding_tokens(*tokenizer, texts[i]));
    if (ids.back().empty()) fail("input ", i, " has no tokens (and this model adds no BOS)");
    if (int64_t(ids.back().size()) > engine.n_ctx())
      fail("input ", i, " has ", ids.back().size(), " tokens but the context holds ", engine.n_ctx(),
           " (raise --ctx or shorten it)");
  }

  // Every input at once (the engine batches them); with --hidden-states a second, unpooled
  // request per input. The queue holds --max-waiting requests: submit in waves past that.
  const bool want_hidden = !hidden_out.empty();
  std::vector<EmbedResult> pooled(texts.size()), hidden(want_hidden ? texts.size() : 0);
  struct Job {
    std::vector<EmbedResult>* into;
    size_t index;
    Pooling pooling;
    bool normalize;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < texts.size(); ++i) {
    jobs.push_back({&pooled, i, pooling, !no_normalize});
    if (want_hidden) jobs.push_back({&hidden, i, Pooling::None, false});
  }
  size_t next = 0;
  while (next < jobs.size() || engine.has_work()) {
    while (next < jobs.size()) {
      const Job& j = jobs[next];
      RequestParams p;
      p.prompt_ids = ids[j.index];
      p.embedding.enabled = true;
      p.embedding.pooling = j.pooling;
      p.embedding.normalize = j.normalize;
      p.lora = lora;
      EmbedResult* slot = &(*j.into)[j.index];
      const uint64_t id = engine.add_request(std::move(p), [slot](const RequestOutput& o) {
        if (!o.finished) return;
        slot->done = true;
        slot->reason = o.finish_reason;
        slot->error = o.error;
        slot->v = o.embedding;
      });
      if (id == 0) break;  // the queue is full: step first
      ++next;
    }
    engine.step();
  }
  for (const auto* results : {&pooled, &hidden})
    for (size_t i = 0; i < results->size(); ++i) {
      const EmbedResult& r = (*results)[i];
      if (!r.done || r.reason != FinishReason::Stop) fail("input ", i, ": ", r.error.empty() ? "not computed" : r.error);
    }

  if (want_hidden) {
    std::vector<float> rows;
    int64_t n_rows = 0;
    for (const EmbedResult& r : hidden) {
      rows.insert(rows.end(), r.v.begin(), r.v.end());
      n_rows += int64_t(r.v.size()) / E;
    }
    const bool npy = hidden_out.size() >= 4 && hidden_out.compare(hidden_out.size() - 4, 4, ".npy") == 0;
    if (npy) write_output_file(hidden_out, npy_bytes(rows, n_rows, E));
    else write_output_file(hidden_out, rows.data(), rows.size() * sizeof(float));
  }

  if (json_out) {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < texts.size(); ++i)
      data.push_back({{"index", i}, {"tokens", ids[i]}, {"embedding", pooled[i].v}});
    const nlohmann::json j = {{"model", margs.model},      {"n_embd", E}, {"pooling", pooling_name(pooling)},
                              {"normalized", !no_normalize}, {"data", std::move(data)}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    // One line per input, each value with the digits that read back as the same float.
    std::string line;
    for (const EmbedResult& r : pooled) {
      line.clear();
      char buf[32];
      for (size_t k = 0; k < r.v.size(); ++k) {
        std::snprintf(buf, sizeof buf, k ? " %.9g" : "%.9g", double(r.v[k]));
        line += buf;
      }
      std::printf("%s\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace tern
