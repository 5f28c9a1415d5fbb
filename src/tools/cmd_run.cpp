// tern run: generate text from a prompt, stream it, report TTFT/TBT/throughput/memory.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "core/error.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "kernels/matmul.h"
#include "runtime/generate.h"
#include "spec/draft_model.h"
#include "tools/chat_loop.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/constraint_args.h"
#include "tools/model_args.h"
#include "tools/prompt_compression.h"
#include "tools/spec_args.h"

namespace tern {
namespace {

// Exit status after Ctrl-C, as a shell reports a process killed by SIGINT (128 + 2).
constexpr int kExitInterrupted = 130;

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

// The first Ctrl-C stops the generation, which then prints the report of the partial text
// (as llama-cli does); a second one exits at once, for a prefill or a report that takes long.
extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) ::_exit(kExitInterrupted);
}

// Installs on_sigint for its lifetime.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = false;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // the streaming writes to stdout go on
    ::sigaction(SIGINT, &sa, &previous_);
  }
  ~InterruptScope() { ::sigaction(SIGINT, &previous_, nullptr); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  struct sigaction previous_ {};
};

// Whether the file starts with GGUF's magic (false when it cannot be read: opening it reports why).
}  // namespace

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt and report the field's metrics (TTFT, TBT, tok/s, memory)."};
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/true, /*default_kv_type=*/KvType::F16);
  margs.add_kv_policy_to(app);
  margs.add_parallel_to(app);
  margs.add_sparse_ffn_to(app);
  ConstraintArgs cargs;
  cargs.add_to(app);
  std::string prompt, prompt_file;
  GenerateOptions opts;
  bool no_bos = false, json = false, parse_special = false;
  int64_t seed = -1;
  app.add_option("-p,--prompt", prompt, "prompt text (empty: start from BOS alone)");
  app.add_option("-f,--file", prompt_file, "read the prompt from a file (exact bytes; -: from stdin)");
  app.add_option("-n,--n-predict", opts.n_predict, "tokens to generate (-1: until EOS or the context is full)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 24));
  app.add_option("--temp", opts.sampling.temperature, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", opts.sampling.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", opts.sampling.top_p, "top-p / nucleus (1: off)")->capture_default_str();
  app.add_option("--min-p", opts.sampling.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", opts.sampling.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  app.add_option("--repeat-last-n", opts.sampling.penalty_last_n, "tokens the penalties look back (-1: all)")->capture_default_str();
  app.add_option("--frequency-penalty", opts.sampling.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("--presence-penalty", opts.sampling.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("-s,--seed", seed, "random seed (-1: a random one, printed in the report)");
  app.add_option("--stop", opts.stop, "stop string (repeatable); trimmed from the output");
  app.add_flag("--ignore-eos", opts.ignore_eos, "keep generating after EOS");
  app.add_flag("--no-bos", no_bos, "do not prepend BOS even if the model asks for it");
  app.add_flag("--parse-special", parse_special,
               "turn special-token texts in the prompt (</s>, <|im_end|>) into those tokens, as /v1/completions "
               "does (default: they are text)");
  app.add_flag("--json", json, "print one JSON object (prompt_ids, ids, text, metrics) instead of streaming");
  // -i: tern chat's conversation (tools/chat_loop.h) with this command's sampling flags.
  bool interactive = false;
  ChatSettings chat;
  app.add_flag("-i,--interactive", interactive,
               "chat as tern chat does (docs/chat.md): the prompt, if any, is the first message");
  add_chat_flags(app, chat, " (with -i)");
  SpecArgs spec_args;
  add_spec_options(app, spec_args);
  PromptCompressArgs compress_args;
  compress_args.add_command_options(app, "compress the prompt first, keeping about 1/R of its tokens; TTFT then includes it",
                                    "with --compress-prompt; default: -m itself");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const bool compress = compress_args.given(app);
  const prompt::CompressOptions compress_opts = compress_args.options(compress ? compress_args.ratio : 2.0);
  const std::string& scorer_path = compress_args.scorer;
  if (compress && interactive) fail("--compress-prompt is for one prompt, not -i");
  opts.spec = spec_config_from_args(spec_args);  // a bad flag fails before anything loads
  if (!prompt_file.empty()) {
    if (!prompt.empty()) fail("give either --prompt or --file, not both");
    if (interactive && prompt_file == "-") fail("-i reads the conversation from stdin: give the first message with -p or -f FILE");
    prompt = prompt_file == "-" ? read_file_text("/dev/stdin", "prompt on stdin") : read_file_text(prompt_file, "prompt file");
  }
  if (interactive) {
    if (opts.spec.source != DraftSource::None)
      fail("--lookup and --draft are not for -i (a conversation decodes one token at a time)");
    if (json) fail("--json is not for -i (a conversation streams its replies)");
    chat.first_message = prompt;
    chat.gen = opts;
    chat.seed = seed;
    chat.constraint = cargs;
    return run_chat(margs, std::move(chat), margs.command());
  }
  opts.sampling.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
  opts.sampling.validate();

  if (cargs.given()) cargs.gbnf_text();  // a bad grammar or schema fails before the model loads
  std::shared_ptr<const GgufFile> draft_file;
  if (opts.spec.source == DraftSource::DraftModel && opts.spec.self_draft.empty())
    draft_file = open_draft_file(opts.spec.draft_path);
  LoadedSession ls = open_session(margs);
  const Tokenizer& tok = *ls.tokenizer;
  if (!opts.spec.self_draft.empty()) {
    resolve_self_draft(opts.spec, ls.file, ls.session->n_threads());
    draft_file = opts.spec.draft_file;
  }
  std::unique_ptr<DraftModel> draft;
  if (draft_file) {
    check_draft_vocab(*ls.file, *draft_file);
    // One sequence: one region, as long as the target's context (capped by the draft's own).
    draft = std::make_unique<DraftModel>(draft_file, ls.session->n_ctx(), /*regions=*/1, ls.session->kv_type());
    opts.draft = draft.get();
  }
  opts.constraint = cargs.build(tok);
  std::optional<CompressedPrompt> compressed;
  if (compress) {
    if (scorer_path.empty()) {
      compressed = compress_with_session(*ls.session, tok, {"", prompt, ""}, compress_opts, compress_args.prompt_options());
      ls.session->reset();
    } else {
      ModelArgs sargs = margs;
      sargs.model = scorer_path;
      sargs.lora.clear();
      sargs.layout = {};
      sargs.sparse = {};  // (the scorer is another model)
      auto sfile = open_model_file(scorer_path);
      const auto stok = Tokenizer::from_gguf(*sfile);
      check_same_vocabulary(*stok, scorer_path, tok, margs.model);
      if (!sargs.ctx_given()) sargs.ctx = std::max<int64_t>(64, int64_t(stok->encode(prompt, true, true).size()) + 8);
      LoadedSession scorer = open_session(sargs, sfile);
      compressed = compress_with_session(*scorer.session, *scorer.tokenizer, {"", prompt, ""}, compress_opts,
                                         compress_args.prompt_options());
    }
    prompt = compressed->text;
    if (!json) std::fprintf(stderr, "tern run: compress-prompt: %s\n", compressed->summary(compress_opts).c_str());
  }
  std::vector<int32_t> prompt_ids = tok.encode(prompt, tok.add_bos_default() && !no_bos, parse_special);
  if (prompt_ids.empty()) fail("the prompt is empty and the model adds no BOS: give a prompt");

  auto stream = [&](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  // From here on Ctrl-C ends the generation with a report (before it, while loading, it kills).
  InterruptScope interrupt_scope;
  opts.interrupt = &g_interrupted;
  if (!json) {
    // Echo the prompt as llama.cpp does, so the output reads as one text.
    const std::string shown = tok.decode(prompt_ids);
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fflush(stdout);
  }
  GenerateResult r =
      generate(*ls.session, tok, prompt_ids, opts, json ? std::function<void(const std::string&)>{} : stream);
  const int exit_code = r.finish_reason == "interrupted" ? kExitInterrupted : 0;
  const auto& m = r.metrics;
  const double tbt_mean = mean(m.tbt_ms), tbt_p50 = percentile(m.tbt_ms, 50), tbt_p99 = percentile(m.tbt_ms, 99);
  const int64_t weight_bytes = ls.session->model().weight_bytes();
  const int64_t kv_bytes = ls.session->kv_bytes();
  // What the context costs: K/V bytes per token (0 for a state-space model) and the fixed
  // recurrent state per sequence (0 for a transformer): MLA's, GQA's and SSMs' savings side by side.
  const HParams& hp = ls.session->hparams();
  const int64_t kv_per_token = kv_bytes_per_token(hp, ls.session->kv_type());
  const int64_t state_per_seq = hp.state_floats_per_sequence() * int64_t(sizeof(float));
  const int64_t rss = peak_rss_bytes();
  if (json) {
    nlohmann::json j;
    j["prompt_ids"] = r.prompt_ids;
    j["ids"] = r.ids;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["seed"] = opts.sampling.seed;
    j["metrics"] = {{"n_prompt", m.n_prompt},         {"n_generated", m.n_generated},
                    {"ttft_ms", m.ttft_ms},           {"tbt_ms_mean", tbt_mean},
                    {"tbt_ms_p50", tbt_p50},          {"tbt_ms_p99", tbt_p99},
                    {"latency_ms", m.latency_ms},     {"prefill_ms", m.prefill_ms},
                    {"prefill_tok_s", m.prefill_tok_s}, {"decode_tok_s", m.decode_tok_s},
                    {"constraint_ms", m.constraint_ms},
                    {"draft", draft_source_name(opts.spec.source)},
                    {"n_drafted", m.n_drafted},       {"n_accepted", m.n_accepted},
                    {"n_target_steps", m.n_target_steps},
                    {"acceptance_rate", m.acceptance_rate},
                    {"accepted_per_step", m.accepted_per_step},
                    {"draft_ms", m.draft_ms},
                    {"weight_bytes", weight_bytes},   {"kv_bytes", kv_bytes},
                    {"kv_bytes_per_token", kv_per_token}, {"state_bytes_per_sequence", state_per_seq},
                    {"n_ctx", ls.session->n_ctx()},
                    {"kv_type", kv_type_name(ls.session->kv_type())},
                    {"peak_rss_bytes", rss},          {"threads", ls.session->pool().size()},
                    {"isa", active_isa()}};
    if (const SparseFfn* sp = ls.session->model().sparse_ffn()) j["sparse_ffn"] = sparse_ffn_json(*sp, m.n_prompt + m.n_generated);
    if (compressed) {
      j["prompt_compression"] = compressed->report(compress_opts);
      j["metrics"]["ttft_ms_with_compression"] = m.ttft_ms + compressed->scorer_ms;
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return exit_code;
  }
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr,
               "\n--- tern run: %lld prompt + %lld generated tokens, finish: %s, seed %llu, %d threads, isa %s\n"
               "TTFT                %10.2f ms\n"
               "TBT mean/p50/p99    %10.2f / %.2f / %.2f ms\n"
               "generation latency  %10.2f ms\n"
               "prefill             %10.2f tok/s\n"
               "decode              %10.2f tok/s\n"
               "weights             %10s\n"
               "%s"
               "peak RSS            %10s\n",
               static_cast<long long>(m.n_prompt), static_cast<long long>(m.n_generated),
               r.finish_reason.c_str(), static_cast<unsigned long long>(opts.sampling.seed),
               ls.session->pool().size(), active_isa(), m.ttft_ms, tbt_mean, tbt_p50, tbt_p99,
               m.latency_ms, m.prefill_tok_s, m.decode_tok_s, format_bytes(weight_bytes).c_str(),
               hp.recurrent()
                   ? str_cat("recurrent state     ", std::string(std::max<int>(0, 10 - int(format_bytes(state_per_seq).size())), ' '),
                             format_bytes(state_per_seq), " (per sequence, at any context length)\n").c_str()
                   : str_cat("KV cache            ", std::string(std::max<int>(0, 10 - int(format_bytes(kv_bytes).size())), ' '),
                             format_bytes(kv_bytes), " (", ls.session->n_ctx(), " tokens, ", kv_type_name(ls.session->kv_type()),
                             ", ", format_bytes(kv_per_token), " per token)\n").c_str(),
               format_bytes(rss).c_str());
  if (const SparseFfn* sp = ls.session->model().sparse_ffn())
    std::fprintf(stderr, "%s\n", sparse_ffn_summary(*sp, m.n_prompt + m.n_generated).c_str());
  if (compressed)
    std::fprintf(stderr, "%-20s%10.2f ms (TTFT with it: %.2f ms)\n", "prompt compression", compressed->scorer_ms,
                 m.ttft_ms + compressed->scorer_ms);
  if (opts.spec.source != DraftSource::None)
    std::fprintf(stderr, "%-20s%10.1f %% of %lld drafts accepted, %.2f tokens per target step, drafting %.1f ms\n",
                 str_cat("speculative (", draft_source_name(opts.spec.source), ")").c_str(), 100.0 * m.acceptance_rate,
                 static_cast<long long>(m.n_drafted), m.accepted_per_step, m.draft_ms);
  return exit_code;
}

}  // namespace tern
