#include "tools/self_samples.h"

#include <span>
#include <vector>

#include "runtime/generate.h"
#include "tools/model_args.h"
#include "tools/progress.h"

namespace tern {

std::string as_one_document(const std::string& text) {
  std::string out;
  bool pending_newline = false;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    if (line.find_first_not_of(" \t\r\f\v") != std::string::npos) {
      if (pending_newline) out += '\n';
      // A SentencePiece text starts with the space the tokenizer's dummy prefix decodes to;
      // tokenizing it again would add a second one.
      out += pending_newline ? line : line.substr(line.find_first_not_of(' '));
      pending_newline = true;
    }
    pos = end + 1;
  }
  return out;
}

std::string sample_documents(const std::string& model_path, std::shared_ptr<const GgufFile> file,
                             const SampleOptions& opts, const std::string& label, int64_t* n_tokens) {
  ModelArgs margs;
  margs.model = model_path;
  margs.threads = opts.threads;
  margs.ctx = opts.sample_len + 1;
  margs.batch = opts.sample_len + 1;
  LoadedSession s = file ? open_session(margs, std::move(file)) : open_session(margs);
  GenerateOptions g;
  g.n_predict = opts.sample_len;
  g.sampling.temperature = opts.temperature;
  g.sampling.top_k = 0;
  g.sampling.top_p = 1.0f;
  g.sampling.min_p = 0.0f;
  Progress progress(label, opts.n_samples, opts.progress);
  std::string text;
  int64_t tokens = 0;
  for (int64_t i = 0; i < opts.n_samples; ++i) {
    g.sampling.seed = opts.seed * 1000003ull + uint64_t(i);
    s.session->reset();
    const std::vector<int32_t> prompt = {s.tokenizer->bos_id()};
    const GenerateResult r = generate(*s.session, *s.tokenizer, prompt, g);
    tokens += int64_t(r.ids.size());
    const std::string doc = as_one_document(r.text);
    if (!doc.empty()) text += doc + "\n\n";
    progress.update(i + 1);
  }
  progress.finish();
  if (n_tokens != nullptr) *n_tokens = tokens;
  return text;
}

}  // namespace tern
