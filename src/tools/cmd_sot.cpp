// `tern sot -m MODEL -p QUESTION`: Skeleton-of-Thought (server/skeleton_of_thought.h). The model
// writes a numbered skeleton of the answer, then every point is expanded at once in one batch of
// sibling sequences that share the question and skeleton through the prefix cache; the answer,
// assembled in order, goes to stdout, the skeleton and a report to stderr (or one JSON object
// to stdout with --json). --skeleton FILE supplies the points. docs/data-level.md.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "engine/engine.h"
#include "models/model.h"
#include "server/api_error.h"
#include "server/backend.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/sot_args.h"

namespace tern {

namespace {

nlohmann::json sot_report_json(const server::SotResult& r, double tokens_per_s) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : r.points)
    points.push_back({{"heading", p.heading},
                      {"text", p.text},
                      {"tokens", p.ids.size()},
                      {"prompt_tokens", p.n_prompt},
                      {"cached_tokens", p.metrics.n_cached_prompt},
                      {"finish_reason", finish_reason_name(p.finish)},
                      {"done_ms", p.done_ms}});
  nlohmann::json j = {{"answer", r.answer()},
                      {"fallback", r.fallback},
                      {"fallback_reason", r.fallback ? nlohmann::json(r.fallback_reason) : nlohmann::json(nullptr)},
                      {"points_given", r.points_given},
                      {"skeleton", r.points_given ? nlohmann::json(nullptr) : nlohmann::json(r.skeleton_text)},
                      {"skeleton_tokens", r.skeleton_ids.size()},
                      {"points", points},
                      {"prompt_tokens", r.prompt_tokens()},
                      {"cached_tokens", r.cached_tokens()},
                      {"completion_tokens", r.completion_tokens()},
                      {"finish_reason", finish_reason_name(r.finish_reason())},
                      {"skeleton_ms", r.skeleton_ms},
                      {"ttft_ms", r.ttft_ms},
                      {"first_point_ms", r.first_point_ms},
                      {"e2e_ms", r.e2e_ms},
                      {"tokens_per_s", tokens_per_s}};
  return j;
}

}  // namespace

int cmd_sot(int argc, char** argv) {
  CLI::App app{"Skeleton-of-Thought: the model writes a skeleton of the answer, then expands every point at once "
               "in one batch (the points share the question through the prefix cache)"};
  app.name("tern sot");
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/true, KvType::F16);
  SotArgs sargs;
  sargs.add_to(app);
  std::string question, question_file, system;
  float temperature = 0;
  uint64_t seed = 1;
  bool ignore_eos = false, json = false;
  app.add_option("-p,--prompt", question, "the question");
  app.add_option("-f,--file", question_file, "read the question from this file instead");
  app.add_option("--system", system, "a system message before the question");
  app.add_option("--temp", temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--seed", seed, "sampling seed (point i samples with seed + i)")->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-generation (fixed-length points, for timing)");
  app.add_flag("--json", json, "print one JSON object: the answer, the skeleton, each point and the timings");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if ((app.count("--prompt") > 0) == (app.count("--file") > 0)) {
    std::fprintf(stderr, "tern sot: give either -p QUESTION or -f FILE\n");
    return 2;
  }
  if (!question_file.empty()) question = read_file_text(question_file, "question file");
  if (!(temperature >= 0)) fail("--temp must be >= 0 (got ", temperature, ")");
  server::SkeletonOptions opt = sargs.options();

  auto file = open_model_file(margs.model, margs.tokenizer_bin);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const server::ChatTemplate tmpl = sot_chat_template(sargs.chat_template, *file, *tok);
  std::vector<server::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", question});
  std::shared_ptr<const server::SkeletonPrompts> prompts;
  try {
    prompts = std::make_shared<server::SkeletonPrompts>(tmpl, *tok, messages);
  } catch (const server::ApiError& e) {
    fail(margs.model, ": ", e.what());
  }

  EngineConfig ecfg;
  ecfg.n_threads = margs.threads;
  ecfg.n_ctx = margs.ctx;
  ecfg.kv_type = kv_type_from_name(margs.kv_type);
  ecfg.n_parallel = opt.max_points;  // every point's sequence fits the default arena
  ecfg.max_running = std::max<int64_t>(ecfg.max_running, opt.max_points);
  Engine engine(file, tok, ecfg);
  server::EngineBackend backend(engine);

  opt.base.sampling.temperature = temperature;
  opt.base.sampling.seed = seed;
  opt.base.ignore_eos = ignore_eos;
  server::SkeletonOfThought sot(backend, prompts, opt);
  try {
    sot.start();
  } catch (const server::ApiError& e) {
    fail(e.what());
  }
  // The engine is driven from this thread: a step, then whatever it produced.
  size_t n_points_done = 0;
  const auto show_skeleton = [&] {
    if (json) return;
    const auto& r = sot.result();
    std::fprintf(stderr, "skeleton (%zu points%s):\n", r.points.size(), r.points_given ? ", given" : "");
    for (size_t i = 0; i < r.points.size(); ++i) std::fprintf(stderr, "  %zu. %s\n", i + 1, r.points[i].heading.c_str());
  };
  if (sot.result().points_given) show_skeleton();
  while (!sot.done()) {
    engine.step();
    for (const auto& ev : sot.poll()) {
      if (ev.kind == server::SotEvent::Kind::Skeleton) show_skeleton();
      if (ev.kind == server::SotEvent::Kind::Fallback && !json)
        std::fprintf(stderr, "skeleton: %s; answering by plain decoding\n", ev.text.c_str());
      if (ev.kind == server::SotEvent::Kind::PointDone && !json)
        std::fprintf(stderr, "\rpoints done: %zu/%zu", ++n_points_done, sot.result().points.size());
    }
  }
  if (n_points_done > 0 && !json) std::fprintf(stderr, "\n");
  const server::SotResult& r = sot.result();
  if (!r.error.empty()) fail("tern sot: ", r.error);
  const double tokens_per_s = r.e2e_ms > 0 ? double(r.completion_tokens()) / (r.e2e_ms / 1000) : 0;
  if (json) {
    std::printf("%s\n", sot_report_json(r, tokens_per_s).dump(2).c_str());
    return 0;
  }
  std::printf("%s\n", r.answer().c_str());
  if (r.fallback)
    std::fprintf(stderr, "sot: plain answer (%s): %zu tokens in %.0f ms\n", r.fallback_reason.c_str(), r.plain_ids.size(),
                 r.e2e_ms);
  else
    std::fprintf(stderr,
                 "sot: %zu points; %s; first point done at %.0f ms, all at %.0f ms; "
                 "%lld tokens, %.1f tokens/s; prefix cache %lld of %lld prompt tokens\n",
                 r.points.size(),
                 r.points_given ? "points given"
                                : str_cat("skeleton ", r.skeleton_ids.size(), " tokens in ", int64_t(r.skeleton_ms), " ms").c_str(),
                 r.first_point_ms, r.e2e_ms,
                 static_cast<long long>(r.completion_tokens()), tokens_per_s, static_cast<long long>(r.cached_tokens()),
                 static_cast<long long>(r.prompt_tokens()));
  return 0;
}

}  // namespace tern
