// tern eval: the base-model replacement gate (docs/eval.md). For every scenario of a suite
// (tools/eval_suite.h) it fine-tunes the scenario's LoRA adapter on the candidate base with the
// scenario's recipe (tern finetune, in-process), reuses the online base's adapter (training it
// first when the file is missing), evaluates both base + adapter pairs on the held-out prompts
// (perplexity of the references, greedy answers scored by exact match, token F1, ROUGE-L and
// the scenario's checks) and prints the three-way table against the recorded production
// figures with the gate's verdict. Exit status 0: every scenario passes; 3: the gate failed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "core/read_file.h"
#include "core/output_file.h"
#include "models/lora.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/eval_report.h"
#include "tools/eval_suite.h"
#include "tools/model_args.h"
#include "tools/text_metrics.h"
#include "train/lora_data.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs tern finetune in this process; its errors name the scenario.
double train_adapter(const EvalScenario& sc, const std::string& base, const std::string& out, int threads, bool quiet) {
  std::vector<std::string> args = {"tern finetune", "--lora", "-m", base, "--data", sc.train, "-o", out};
  if (!sc.val.empty()) args.insert(args.end(), {"--val", sc.val});
  const std::vector<std::string> recipe = recipe_arguments(sc.recipe, "scenario \"" + sc.name + "\"");
  args.insert(args.end(), recipe.begin(), recipe.end());
  if (threads > 0) args.insert(args.end(), {"-t", std::to_string(threads)});
  if (quiet) args.push_back("-q");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::string shown;
  for (size_t i = 1; i < args.size(); ++i) shown += " " + args[i];
  std::fprintf(stderr, "tern eval: scenario %s: tern finetune%s\n", sc.name.c_str(), shown.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  // tern finetune prints its summary on stdout, which is this command's report (--json): send
  // it to stderr while it runs.
  std::fflush(stdout);
  const int saved_stdout = ::dup(STDOUT_FILENO);
  if (saved_stdout < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) fail("tern eval: cannot redirect stdout");
  int rc = 0;
  std::string error;
  try {
    rc = cmd_finetune(int(argv.size()), argv.data());
  } catch (const Error& e) {
    error = e.what();
  }
  std::fflush(stdout);
  ::dup2(saved_stdout, STDOUT_FILENO);
  ::close(saved_stdout);
  if (!error.empty()) fail("scenario \"", sc.name, "\": fine-tuning on ", base, ": ", error);
  if (rc != 0) fail("scenario \"", sc.name, "\": tern finetune on ", base, " stopped with status ", rc);
  return seconds_since(t0);
}

// Natural log of softmax(logits)[target], in double.
double log_prob(const float* logits, int64_t n_vocab, int32_t target) {
  double mx = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return double(logits[target]) - mx - std::log(sum);
}

int32_t argmax(const float* logits, int64_t n_vocab) {
  int32_t best = 0;
  for (int64_t i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}

// The scenario's metrics on one base (+ adapters, as the session runs); the generated answers
// go to `texts` (one per item).
MetricValues evaluate(Session& session, const Tokenizer& tok, const EvalScenario& sc, std::vector<std::string>* texts) {
  const int64_t n_vocab = session.hparams().n_vocab;
  double nll = 0, em = 0, f1 = 0, rl = 0;
  int64_t n_tokens = 0;
  std::vector<double> check_pass(sc.checks.size(), 0.0);
  std::vector<float> last(static_cast<size_t>(n_vocab));
  texts->clear();
  for (size_t i = 0; i < sc.items.size(); ++i) {
    const EvalItem& item = sc.items[i];
    const train::Example ex = train::make_example(tok, item.prompt, item.reference, false);
    const int64_t n_all = int64_t(ex.ids.size()), n_prompt = ex.n_prompt, n_ref = n_all - n_prompt;
    if (n_ref <= 0 || n_prompt <= 0)
      fail("scenario \"", sc.name, "\": ", sc.eval, " item ", i + 1, ": the reference gives no token");
    if (n_all > session.n_ctx())
      fail("scenario \"", sc.name, "\": ", sc.eval, " item ", i + 1, ": prompt + reference are ", n_all,
           " tokens, more than the context of ", session.n_ctx());
    // Perplexity of the reference given the prompt: row t predicts token t + 1.
    session.reset();
    const float* logits = session.eval(std::span<const int32_t>(ex.ids.data(), size_t(n_all - 1)), true);
    for (int64_t t = n_prompt - 1; t < n_all - 1; ++t) nll -= log_prob(logits + t * n_vocab, n_vocab, ex.ids[size_t(t + 1)]);
    n_tokens += n_ref;
    // Greedy answer of the reference's length, from the prompt's K/V.
    std::copy(logits + (n_prompt - 1) * n_vocab, logits + n_prompt * n_vocab, last.begin());
    session.truncate(n_prompt);
    std::vector<int32_t> gen;
    const float* cur = last.data();
    while (int64_t(gen.size()) < n_ref) {
      const int32_t id = argmax(cur, n_vocab);
      if (tok.is_eog(id)) break;
      gen.push_back(id);
      if (int64_t(gen.size()) == n_ref || session.n_past() >= session.n_ctx()) break;
      cur = session.eval(std::span<const int32_t>(&gen.back(), 1));
    }
    const std::string text = tok.decode(gen);
    em += exact_match(text, item.reference);
    f1 += token_f1(text, item.reference);
    rl += rouge_l(text, item.reference);
    for (size_t c = 0; c < sc.checks.size(); ++c) check_pass[c] += check_passes(sc.checks[c], text) ? 1.0 : 0.0;
    texts->push_back(text);
  }
  const double n = double(sc.items.size());
  MetricValues m;
  m["ppl"] = std::exp(nll / double(n_tokens));
  m["exact_match"] = em / n;
  m["token_f1"] = f1 / n;
  m["rouge_l"] = rl / n;
  for (size_t c = 0; c < sc.checks.size(); ++c) m["check:" + sc.checks[c].name] = check_pass[c] / n;
  return m;
}

std::string stem_of(const std::string& path) { return fs::path(path).stem().string(); }

}  // namespace

int cmd_eval(int argc, char** argv) {
  CLI::App app{"Base-model replacement: retrain every scenario's LoRA adapter on a candidate base and compare it "
               "with the online base + adapters and the production figures (a three-way table and a gate)"};
  std::string suite_path, online_base, candidate_base, work = "tern-eval-work", svg;
  std::vector<std::string> only;
  bool reuse = false, retrain = false, json = false, quiet = false, show_bases = false;
  int threads = 0;
  int64_t ctx = 0;
  app.add_option("--suite", suite_path, "the suite file (JSON: scenarios with data, recipe, eval set, thresholds)")
      ->required();
  app.add_option("--online-base", online_base, "the base model production runs now (GGUF)")->required();
  app.add_option("--candidate-base", candidate_base, "the base model that would replace it (GGUF)")->required();
  app.add_option("--work", work, "folder for the candidate's adapters (<scenario>.<candidate stem>.gguf)")
      ->capture_default_str();
  app.add_flag("--reuse", reuse, "evaluate candidate adapters already in --work as they are (no training)");
  app.add_flag("--retrain", retrain, "retrain candidate adapters already in --work (replacing them)");
  app.add_option("--scenario", only, "evaluate only these scenarios (repeatable)");
  app.add_flag("--show-bases", show_bases, "also evaluate both bases without adapters (two more columns)");
  app.add_option("--ctx", ctx, "evaluation context (default: the models' own, sized to the machine)");
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  app.add_flag("--json", json, "print the report as one JSON object instead of the tables");
  app.add_option("--svg", svg, "write a chart of every metric per scenario (SVG)");
  app.add_flag("-q,--quiet", quiet, "no progress bars while fine-tuning");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  // Everything that can be wrong with the arguments, before any slow work.
  if (reuse && retrain) fail("give --reuse or --retrain, not both");
  if (threads < 0) fail("--threads must be positive");
  if (ctx < 0) fail("--ctx must not be negative");
  for (const std::string& b : {online_base, candidate_base})
    if (!path_exists(b)) fail(b, ": no such model file");
  EvalSuite suite = load_eval_suite(suite_path);
  std::vector<const EvalScenario*> scenarios;
  for (const EvalScenario& sc : suite.scenarios)
    if (only.empty() || std::find(only.begin(), only.end(), sc.name) != only.end()) scenarios.push_back(&sc);
  for (const std::string& o : only)
    if (std::none_of(suite.scenarios.begin(), suite.scenarios.end(), [&](const EvalScenario& s) { return s.name == o; }))
      fail("--scenario ", o, ": suite ", suite_path, " has no such scenario");
  if (!svg.empty()) {
    check_output_path(svg);
    check_output_not_input(svg, {suite_path, online_base, candidate_base});
  }
  if (!path_exists(work)) {
    std::error_code ec;
    fs::create_directories(work, ec);
    if (ec) fail("--work ", work, ": cannot create it (", ec.message(), ")");
  }
  if (!fs::is_directory(work)) fail("--work ", work, " is not a folder");

  std::vector<ScenarioResult> results(scenarios.size());
  for (size_t i = 0; i < scenarios.size(); ++i) {
    ScenarioResult& r = results[i];
    r.scenario = scenarios[i];
    r.online_adapter = r.scenario->online_adapter;
    r.candidate_adapter = (fs::path(work) / (r.scenario->name + "." + stem_of(candidate_base) + ".gguf")).string();
    if (path_exists(r.candidate_adapter) && !reuse && !retrain)
      fail("scenario \"", r.scenario->name, "\": ", r.candidate_adapter,
           " exists (give --reuse to evaluate it as it is, or --retrain to replace it)");
    if (!path_exists(r.candidate_adapter) && reuse)
      std::fprintf(stderr, "tern eval: scenario %s: %s does not exist yet: training it\n", r.scenario->name.c_str(),
                   r.candidate_adapter.c_str());
    if (!path_exists(r.online_adapter)) check_output_path(r.online_adapter);
    check_output_path(r.candidate_adapter);
    check_output_not_input(r.candidate_adapter, {suite_path, online_base, candidate_base, r.scenario->train,
                                                 r.scenario->val, r.scenario->eval, r.online_adapter});
  }

  // 1. The adapters: the online base's when missing, the candidate's always (unless reused).
  for (ScenarioResult& r : results) {
    if (!path_exists(r.online_adapter)) {
      std::fprintf(stderr, "tern eval: scenario %s: the online adapter %s does not exist: training it on %s\n",
                   r.scenario->name.c_str(), r.online_adapter.c_str(), online_base.c_str());
      r.online_train_s = train_adapter(*r.scenario, online_base, r.online_adapter, threads, quiet);
      r.online_trained = true;
    }
    if (!(reuse && path_exists(r.candidate_adapter))) {
      r.candidate_train_s = train_adapter(*r.scenario, candidate_base, r.candidate_adapter, threads, quiet);
      r.candidate_trained = true;
    }
  }

  // 2. Evaluation, one base at a time (one model in memory).
  for (int which = 0; which < 2; ++which) {
    const std::string& base = which == 0 ? online_base : candidate_base;
    ModelArgs margs;
    margs.model = base;
    margs.threads = threads;
    margs.ctx = ctx;
    LoadedSession ls = open_session(margs);
    std::fprintf(stderr, "tern eval: evaluating %s (%s base)\n", base.c_str(), which == 0 ? "online" : "candidate");
    for (ScenarioResult& r : results) {
      const EvalScenario& sc = *r.scenario;
      const std::string& adapter_path = which == 0 ? r.online_adapter : r.candidate_adapter;
      std::shared_ptr<const LoraAdapter> adapter;
      try {
        adapter = LoraAdapter::load(adapter_path);
        adapter->check_base(*ls.file);
      } catch (const Error& e) {
        fail("scenario \"", sc.name, "\": the ", which == 0 ? "online" : "candidate", " adapter does not fit ", base,
             ": ", e.what());
      }
      std::vector<std::string> texts, base_texts;
      if (show_bases) {
        ls.session->set_lora({});
        (which == 0 ? r.online_base : r.candidate_base) = evaluate(*ls.session, *ls.tokenizer, sc, &base_texts);
      }
      ls.session->set_lora({LoraUse{adapter, 1.0f}});
      (which == 0 ? r.online : r.candidate) = evaluate(*ls.session, *ls.tokenizer, sc, &texts);
      r.samples.resize(std::min<size_t>(3, sc.items.size()));
      for (size_t k = 0; k < r.samples.size(); ++k) {
        r.samples[k].prompt = sc.items[k].prompt;
        r.samples[k].reference = sc.items[k].reference;
        (which == 0 ? r.samples[k].online : r.samples[k].candidate) = texts[k];
      }
    }
  }

  // 3. The gate and the report.
  bool pass = true;
  for (ScenarioResult& r : results) {
    r.verdict = gate_scenario(*r.scenario, r.online, r.candidate);
    pass = pass && r.verdict.pass;
  }
  int n_pass = 0;
  for (const ScenarioResult& r : results) n_pass += r.verdict.pass ? 1 : 0;
  if (json) {
    nlohmann::json j;
    j["suite"] = suite.name;
    j["suite_file"] = suite.path;
    j["online_base"] = online_base;
    j["candidate_base"] = candidate_base;
    j["scenarios"] = nlohmann::json::array();
    for (const ScenarioResult& r : results) j["scenarios"].push_back(scenario_json(r));
    j["pass"] = pass;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("tern eval: suite %s: online base %s, candidate base %s\n", suite.name.c_str(), online_base.c_str(),
                candidate_base.c_str());
    std::printf("  production: the suite's recorded figures; online: online base + its adapter; candidate: candidate "
                "base + the adapter retrained on it\n");
    for (const ScenarioResult& r : results) print_scenario_table(stdout, r, show_bases);
    std::printf("\ngate: %s (%d of %zu scenarios pass)%s\n", pass ? "PASS" : "FAIL", n_pass, results.size(),
                pass ? ": the candidate base may replace the online base" : "");
  }
  if (!svg.empty()) {
    write_output_file(svg, eval_svg_chart(results, "tern eval " + suite.name + ": " + stem_of(online_base) + " vs " +
                                                       stem_of(candidate_base)));
    std::fprintf(stderr, "tern eval: chart written to %s\n", svg.c_str());
  }
  std::fflush(stdout);
  return pass ? 0 : 3;
}

}  // namespace tern
