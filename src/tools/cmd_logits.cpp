// tern logits: the raw logits of every position of a prompt, for comparing engines and for
// test oracles (tests/py compares them with an independent numpy implementation).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/output_file.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"

namespace tern {

int cmd_logits(int argc, char** argv) {
  CLI::App app{"Print or save the logits of every position of a prompt (one batched prefill)."};
  ModelArgs margs;
  margs.add_to(app);
  margs.add_parallel_to(app);
  std::string prompt, ids_text, out_file;
  bool no_bos = false, json = false;
  app.add_option("-p,--prompt", prompt, "prompt text");
  app.add_option("--ids", ids_text, "token ids instead of a prompt, e.g. \"1 403 407\"");
  app.add_option("-o,--output", out_file, "write raw little-endian f32 [n_tokens x n_vocab] here");
  app.add_flag("--no-bos", no_bos, "do not prepend BOS");
  app.add_flag("--json", json, "print {ids, n_vocab, argmax, logits} as JSON");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (!out_file.empty()) {
    check_output_path(out_file);
    check_output_not_input(out_file, {margs.model, margs.tokenizer_bin});
  }
  LoadedSession ls = open_session(margs);
  std::vector<int32_t> ids;
  if (!ids_text.empty()) {
    std::istringstream is(ids_text);
    long long v;
    while (is >> v) ids.push_back(int32_t(v));
    if (!is.eof()) fail("--ids: expected whitespace-separated integers");
  } else {
    ids = ls.tokenizer->encode(prompt, ls.tokenizer->add_bos_default() && !no_bos);
  }
  if (ids.empty()) fail("no tokens to evaluate");
  const float* logits = ls.session->eval(ids, /*all_logits=*/true);
  const int64_t V = ls.session->hparams().n_vocab;
  const size_t n = ids.size() * size_t(V);
  if (!out_file.empty()) write_output_file(out_file, logits, n * sizeof(float));
  nlohmann::json j;
  j["ids"] = ids;
  j["n_vocab"] = V;
  std::vector<int64_t> argmax;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = logits + t * size_t(V);
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    argmax.push_back(best);
  }
  j["argmax"] = argmax;
  if (json) {
    if (out_file.empty()) j["logits"] = std::vector<float>(logits, logits + n);
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t t = 0; t < ids.size(); ++t)
      std::printf("pos %zu token %d argmax %lld\n", t, ids[t], static_cast<long long>(argmax[t]));
  }
  return 0;
}

}  // namespace tern
