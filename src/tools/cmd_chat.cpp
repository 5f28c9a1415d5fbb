// tern chat: an interactive conversation with a model through its chat template (docs/chat.md).
#include "core/error.h"
#include "tools/chat_loop.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"

namespace tern {

int cmd_chat(int argc, char** argv) {
  CLI::App app{"Chat with a model in the terminal: its chat template, streaming, /save and /load (docs/chat.md)."};
  ModelArgs margs;
  // f16 K/V as run and serve, so that a conversation gets the server's tokens.
  margs.add_to(app, /*with_ctx=*/true, /*default_kv_type=*/KvType::F16);
  margs.add_sparse_ffn_to(app);
  ChatSettings s;
  s.gen.n_predict = -1;
  add_chat_flags(app, s);
  GenerateOptions& g = s.gen;
  app.add_option("-p,--prompt", s.first_message, "first user message, sent before any input is read");
  app.add_option("-n,--n-predict", g.n_predict, "most tokens per reply (-1: until end of turn or a full context)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 24));
  app.add_option("--temp", g.sampling.temperature, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", g.sampling.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", g.sampling.top_p, "top-p / nucleus (1: off)")->capture_default_str();
  app.add_option("--min-p", g.sampling.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", g.sampling.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  app.add_option("--repeat-last-n", g.sampling.penalty_last_n, "tokens the penalties look back (-1: all)")
      ->capture_default_str();
  app.add_option("--frequency-penalty", g.sampling.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("--presence-penalty", g.sampling.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("-s,--seed", s.seed, "seed of every reply's sampling (-1: a random one per reply)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 53));
  app.add_option("--stop", g.stop, "stop string (repeatable); trimmed from the reply");
  app.add_flag("--ignore-eos", g.ignore_eos, "keep generating after the end-of-turn token");
  s.constraint.add_to(app);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  return run_chat(margs, std::move(s), margs.command());
}

}  // namespace tern
