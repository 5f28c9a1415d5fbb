// tern batch: offline generation for a file of prompts, data-parallel over the ranks of an MPI
// job (docs/distributed.md): each rank loads the whole model and runs its share of the prompts
// (dealt by length, longest first to the least-loaded rank) through its own continuous-batching
// engine; rank 0 writes every
// completion, in the file's order, to one JSONL file. Alone (no mpirun) it is one rank.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "dist/comm.h"
#include "dist/jobs.h"
#include "engine/engine.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/progress.h"

namespace tern {
namespace {

constexpr const char* kBatchJob = "batch";

// Prompts from a file: a ShareGPT JSON array (first human turn of each conversation), JSONL
// ({"prompt": ...} per line), or plain text (one prompt per non-empty line).
std::vector<std::string> read_batch_prompts(const std::string& path) {
  const std::string raw = read_file_text(path, "prompts file");
  std::vector<std::string> out;
  size_t first = raw.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && raw[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(raw);
    } catch (const std::exception& e) {
      fail(path, ": not valid JSON: ", e.what());
    }
    for (const auto& item : j) {
      if (item.is_string()) {
        out.push_back(item.get<std::string>());
        continue;
      }
      const auto it = item.is_object() ? item.find("conversations") : item.end();
      if (it == item.end() || !it->is_array() || it->empty()) continue;
      const auto& turn = (*it)[0];
      if (turn.is_object() && turn.contains("value") && turn["value"].is_string()) out.push_back(turn["value"].get<std::string>());
    }
  } else {
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos <= raw.size()) {
      const size_t end = std::min(raw.find('\n', pos), raw.size());
      std::string line = raw.substr(pos, end - pos);
      ++line_no;
      pos = end + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      if (line[line.find_first_not_of(" \t")] == '{') {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
          fail(path, ":", line_no, ": not valid JSON: ", e.what());
        }
        if (!j.contains("prompt") || !j["prompt"].is_string()) fail(path, ":", line_no, ": expected {\"prompt\": \"...\"}");
        out.push_back(j["prompt"].get<std::string>());
      } else {
        out.push_back(line);
      }
    }
  }
  for (const std::string& p : out)
    if (p.empty()) fail(path, ": an empty prompt");
  if (out.empty()) fail(path, ": no prompts");
  return out;
}

// One rank's share: its prompts through one engine. The result: a JSON array of
// {index, completion, n_prompt, n_generated, finish_reason, ms} or {index, error}, and the
// rank's totals.
std::string run_batch_share(const std::string& payload, int rank, int n_ranks) {
  const nlohmann::json job = nlohmann::json::parse(payload);
  const auto prompts = job.at("prompts").get<std::vector<std::string>>();
  const auto t0 = std::chrono::steady_clock::now();
  auto file = open_model_file(job.at("model").get<std::string>());
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg;
  cfg.n_threads = job.at("threads").get<int>();
  cfg.n_ctx = job.at("ctx").get<int64_t>();
  cfg.n_parallel = job.at("parallel").get<int64_t>();
  cfg.kv_type = kv_type_from_name(job.at("kv_type").get<std::string>());
  Engine engine(file, tok, cfg);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  struct Item {
    int64_t index = 0;
    std::string text, error, finish;
    int64_t n_prompt = 0, n_generated = 0;
    double ms = 0;
    bool done = false;
  };
  // The share: every rank tokenizes every prompt and deals them out the same way, longest
  // first to the rank with the least work so far (prompt tokens + tokens to generate): prompts
  // of very different lengths (ShareGPT's) left 40% of one rank's time idle dealt round-robin.
  const int64_t max_tokens = job.at("max_tokens").get<int64_t>();
  std::vector<std::vector<int32_t>> ids(prompts.size());
  std::vector<int64_t> order(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids[i] = tok->encode(prompts[i], tok->add_bos_default());
    order[i] = int64_t(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[size_t(a)].size() > ids[size_t(b)].size(); });
  std::vector<int64_t> load(size_t(n_ranks), 0);
  std::vector<int> owner(prompts.size(), 0);
  for (int64_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[size_t(i)] = r;
    load[size_t(r)] += int64_t(ids[size_t(i)].size()) + max_tokens;
  }
  std::vector<Item> items;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (owner[i] == rank) {
      items.emplace_back();
      items.back().index = int64_t(i);
    }
  const auto start = std::chrono::steady_clock::now();
  size_t next = 0, n_done = 0;
  const auto submit = [&] {
    // As many as the engine's queue takes; the rest after a step.
    while (next < items.size()) {
      Item& it = items[next];
      RequestParams rp;
      rp.prompt_ids = std::move(ids[size_t(it.index)]);
      rp.max_tokens = max_tokens;
      rp.ignore_eos = job.at("ignore_eos").get<bool>();
      rp.sampling.temperature = job.at("temperature").get<float>();
      rp.sampling.seed = job.at("seed").get<uint64_t>() + uint64_t(it.index);  // the same on any rank
      try {
        const uint64_t id = engine.add_request(std::move(rp), [&it, &n_done](const RequestOutput& o) {
          it.text += o.text;
          if (!o.finished) return;
          it.done = true;
          it.finish = finish_reason_name(o.finish_reason);
          it.error = o.error;
          it.n_prompt = o.metrics.n_prompt;
          it.n_generated = o.metrics.n_generated;
          it.ms = o.metrics.e2e_ms;
          ++n_done;
        });
        if (id == 0) return;  // queue full: after the next step
      } catch (const Error& e) {
        // One prompt that can never run (longer than the context) fails alone.
        it.error = e.what();
        it.done = true;
        ++n_done;
      }
      ++next;
    }
  };
  submit();
  while (n_done < items.size()) {
    engine.step();
    submit();
  }
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json out = nlohmann::json::array();
  int64_t generated = 0, prompt_tokens = 0;
  for (const Item& it : items) {
    generated += it.n_generated;
    prompt_tokens += it.n_prompt;
    nlohmann::json j = {{"index", it.index}, {"rank", rank}};
    if (!it.error.empty()) j["error"] = it.error;
    else j.update({{"completion", it.text}, {"n_prompt", it.n_prompt}, {"n_generated", it.n_generated},
                   {"finish_reason", it.finish}, {"ms", it.ms}});
    out.push_back(j);
  }
  return nlohmann::json{{"items", out},
                        {"rank", rank},
                        {"n_prompts", items.size()},
                        {"prompt_tokens", prompt_tokens},
                        {"generated_tokens", generated},
                        {"load_s", load_s},
                        {"run_s", run_s}}
      .dump();
}

}  // namespace

void register_batch_job() { dist::register_job(kBatchJob, run_batch_share); }

int cmd_batch(int argc, char** argv) {
  CLI::App app{"Generate completions for a file of prompts; under mpirun, data-parallel over the ranks."};
  std::string model, prompts_path, out_path, kv_type = "f16";
  int threads = 0;
  int64_t n_gen = 128, ctx = 1024, parallel = 8, limit = 0;
  float temp = 0.0f;
  uint64_t seed = 42;
  bool ignore_eos = false, json = false;
  app.add_option("-m,--model", model, "model file (GGUF); every rank opens the same path")->required();
  app.add_option("-f,--file", prompts_path,
                 "prompts: one per line, JSONL {\"prompt\": ...}, or a ShareGPT JSON array (first human turns)")
      ->required();
  app.add_option("-o,--output", out_path, "completions, one JSON object per line in the file's order")->required();
  app.add_option("-n,--n-predict", n_gen, "most tokens to generate per prompt")->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("-t,--threads", threads, "threads per rank (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("-c,--ctx", ctx, "context per sequence (prompt + completion)")->check(CLI::Range(int64_t(8), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("--parallel", parallel, "sequences each rank's engine decodes at once")->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->capture_default_str();
  app.add_option("--temp", temp, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  app.add_option("-s,--seed", seed, "seed; prompt i samples with seed + i, so the output does not depend on the ranks")
      ->capture_default_str();
  app.add_option("--limit", limit, "the first N prompts only (0: all)")->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_flag("--ignore-eos", ignore_eos, "generate n tokens for every prompt");
  add_kv_type_option(app, kv_type, KvType::F16);
  app.add_flag("--json", json, "print the report as one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  check_output_not_input(out_path, {model, prompts_path});
  std::vector<std::string> prompts = read_batch_prompts(prompts_path);
  if (limit > 0 && int64_t(prompts.size()) > limit) prompts.resize(size_t(limit));
  (void)read_hparams(*open_model_file(model));  // a bad model fails here, before the ranks start
  const nlohmann::json job = {{"model", model},     {"threads", threads},         {"ctx", ctx},
                              {"parallel", parallel}, {"kv_type", kv_type},         {"max_tokens", n_gen},
                              {"temperature", temp}, {"seed", seed},               {"ignore_eos", ignore_eos},
                              {"prompts", prompts}};
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> results = dist::run_everywhere(kBatchJob, job.dump());
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<nlohmann::json> by_index(prompts.size());
  nlohmann::json ranks = nlohmann::json::array();
  int64_t generated = 0, failed = 0;
  for (const std::string& r : results) {
    nlohmann::json j = nlohmann::json::parse(r);
    for (auto& item : j.at("items")) by_index[size_t(item.at("index").get<int64_t>())] = item;
    generated += j.at("generated_tokens").get<int64_t>();
    j.erase("items");
    j["tok_s"] = j.at("generated_tokens").get<double>() / std::max(1e-9, j.at("run_s").get<double>());
    ranks.push_back(j);
  }
  std::string lines;
  for (size_t i = 0; i < by_index.size(); ++i) {
    nlohmann::json& item = by_index[i];
    if (item.is_null()) fail("prompt ", i, " came back from no rank");
    if (item.contains("error")) ++failed;
    item["prompt"] = prompts[i];
    lines += item.dump() + "\n";
  }
  write_output_file(out_path, lines);
  const nlohmann::json report = {{"prompts", prompts.size()},  {"failed", failed},          {"ranks", ranks},
                                 {"generated_tokens", generated}, {"wall_s", wall_s},
                                 {"tok_s", double(generated) / wall_s}, {"output", out_path}};
  if (json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    std::printf("| rank | prompts | generated tokens | load s | run s | tok/s |\n|---|---|---|---|---|---|\n");
    for (const auto& r : ranks)
      std::printf("| %d | %lld | %lld | %.2f | %.2f | %.1f |\n", r.at("rank").get<int>(),
                  static_cast<long long>(r.at("n_prompts").get<int64_t>()),
                  static_cast<long long>(r.at("generated_tokens").get<int64_t>()), r.at("load_s").get<double>(),
                  r.at("run_s").get<double>(), r.at("tok_s").get<double>());
    std::printf("\n%zu prompts (%lld failed), %lld tokens in %.2f s: %.1f tok/s over %zu rank%s; wrote %s\n",
                prompts.size(), static_cast<long long>(failed), static_cast<long long>(generated), wall_s,
                double(generated) / wall_s, ranks.size(), ranks.size() == 1 ? "" : "s", out_path.c_str());
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace tern
