// tern distill: knowledge distillation from a teacher GGUF into a student that `tern train`
// would train (a new shape or -m). Token-level (the teacher's logits at every position, computed
// on the fly: forward KL, reverse KL or their mix, plus the hard-label loss) and sequence-level
// (--teacher-samples N: the student also trains on N texts the teacher writes, which works
// across tokenizers). docs/training.md has the options and the figures.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/output_file.h"
#include "runtime/generate.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/progress.h"
#include "tools/train_args.h"
#include "train/distill.h"

namespace tern {
namespace {

// The first id where the two vocabularies differ, or -1 when they are the same.
int64_t first_vocab_difference(const GgufFile& a, const GgufFile& b, std::string* what) {
  const GgufValue* ta = a.find("tokenizer.ggml.tokens");
  const GgufValue* tb = b.find("tokenizer.ggml.tokens");
  if (ta == nullptr || tb == nullptr) {
    *what = "one of the files has no tokenizer.ggml.tokens";
    return 0;
  }
  const auto& ia = ta->as_array("tokenizer.ggml.tokens").items;
  const auto& ib = tb->as_array("tokenizer.ggml.tokens").items;
  const size_t n = std::min(ia.size(), ib.size());
  for (size_t i = 0; i < n; ++i) {
    if (ia[i].as_string() != ib[i].as_string()) {
      *what = str_cat("token ", i, " is '", ia[i].as_string(), "' in one and '", ib[i].as_string(), "' in the other");
      return int64_t(i);
    }
  }
  if (ia.size() != ib.size()) {
    *what = str_cat(ia.size(), " tokens against ", ib.size());
    return int64_t(n);
  }
  return -1;
}

// One sample per document: blank lines inside a sample would split it.
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

}  // namespace

int cmd_distill(int argc, char** argv) {
  CLI::App app{"Distill a teacher GGUF into a student (token-level KD on the fly, and/or sequence-level)"};
  TrainArgs a;
  add_train_args(app, a, /*distill=*/true);
  std::string teacher_path, kd_name = "fkl", save_samples;
  train::KdConfig kd;
  int64_t n_samples = 0, sample_len = 0;
  float sample_temp = 1.0f;
  app.add_option("--teacher", teacher_path, "the teacher model (GGUF, any architecture tern runs)")->required();
  app.add_option("--kd", kd_name, "token-level loss: fkl (forward KL), rkl (reverse KL), mix, none (hard labels only)")
      ->capture_default_str();
  app.add_option("--temperature", kd.temperature, "softening temperature of both distributions")->capture_default_str();
  app.add_option("--kd-mix", kd.mix, "with --kd mix: the forward KL's weight")->capture_default_str();
  app.add_option("--hard-weight", kd.hard_weight, "weight of the hard-label cross-entropy (the soft loss gets 1 - it)")
      ->capture_default_str();
  app.add_option("--teacher-samples", n_samples, "sequence-level KD: also train on this many texts the teacher writes");
  app.add_option("--sample-len", sample_len, "tokens per teacher sample (default: --ctx)");
  app.add_option("--sample-temp", sample_temp, "sampling temperature of the teacher samples")->capture_default_str();
  app.add_option("--save-samples", save_samples, "write the teacher samples to this text file");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  kd.divergence = train::parse_kd_divergence(kd_name);
  if (!(kd.temperature > 0.0)) fail("--temperature must be positive");
  if (kd.hard_weight < 0.0 || kd.hard_weight > 1.0) fail("--hard-weight must be in [0, 1]");
  if (kd.mix < 0.0 || kd.mix > 1.0) fail("--kd-mix must be in [0, 1]");
  if (n_samples < 0 || sample_len < 0) fail("--teacher-samples and --sample-len must not be negative");
  if (!(sample_temp > 0.0f)) fail("--sample-temp must be positive");
  if (!save_samples.empty()) {
    check_output_path(save_samples);
    check_output_not_input(save_samples, {teacher_path, a.data, a.val, a.model, a.vocab_from});
  }
  check_output_not_input(a.out, {teacher_path});

  // Token-level KD compares distributions over the same ids: refuse another vocabulary before
  // any slow work.
  const auto teacher_file = open_model_file(teacher_path);
  const bool token_level = kd.divergence != train::KdDivergence::None;
  if (token_level) {
    const std::string student_vocab = a.resume ? a.out : !a.model.empty() ? a.model : a.vocab_from;
    if (!student_vocab.empty()) {
      const GgufFile sv = GgufFile::open(student_vocab);
      std::string diff;
      if (first_vocab_difference(*teacher_file, sv, &diff) >= 0)
        fail("token-level distillation needs the same vocabulary in teacher and student: ", teacher_path, " and ", student_vocab,
             " differ (", diff, "); use sequence-level distillation instead: --kd none --teacher-samples N");
    }
  }

  ModelArgs targs;
  targs.model = teacher_path;
  targs.threads = a.threads;
  std::string samples_text;
  if (n_samples > 0) {
    const int64_t len = sample_len > 0 ? sample_len : (a.n_ctx > 0 ? a.n_ctx : 256);
    targs.ctx = len + 1;
    targs.batch = len + 1;
    LoadedSession ts = open_session(targs, teacher_file);
    GenerateOptions g;
    g.n_predict = len;
    g.sampling.temperature = sample_temp;
    g.sampling.top_k = 0;
    g.sampling.top_p = 1.0f;
    g.sampling.min_p = 0.0f;
    Progress progress("teacher samples", n_samples, !a.quiet && !a.json);
    int64_t n_tokens = 0;
    for (int64_t i = 0; i < n_samples; ++i) {
      g.sampling.seed = a.cfg.seed * 1000003ull + uint64_t(i);
      ts.session->reset();
      const std::vector<int32_t> prompt = {ts.tokenizer->bos_id()};
      const GenerateResult r = generate(*ts.session, *ts.tokenizer, prompt, g);
      n_tokens += int64_t(r.ids.size());
      const std::string doc = as_one_document(r.text);
      if (!doc.empty()) samples_text += doc + "\n\n";
      progress.update(i + 1);
    }
    progress.finish();
    std::fprintf(stderr, "tern distill: %lld teacher samples, %lld tokens\n", static_cast<long long>(n_samples),
                 static_cast<long long>(n_tokens));
    if (!save_samples.empty()) write_output_file(save_samples, samples_text);
  }

  TrainSetup s = setup_training(app, a, "tern distill", false, n_samples > 0 ? &samples_text : nullptr);
  if (token_level && a.vocab_from.empty() && a.model.empty() && !a.resume) fail("tern distill: no student");

  std::unique_ptr<LoadedSession> teacher;
  std::vector<float> teacher_logits;
  if (token_level) {
    targs.ctx = a.cfg.n_ctx;
    targs.batch = a.cfg.n_ctx;
    teacher = std::make_unique<LoadedSession>(open_session(targs, teacher_file));
    const int64_t V = s.model.shape.n_vocab;
    if (teacher->session->hparams().n_vocab != V)
      fail(teacher_path, ": the teacher's logits have ", teacher->session->hparams().n_vocab,
           " columns, the student's vocabulary ", V);
    teacher_logits.assign(size_t(a.cfg.n_seq * a.cfg.n_ctx * V), 0.0f);
    s.trainer->set_before_batch([&, V](const int32_t* windows, int64_t n_seq, int64_t n_ctx) {
      for (int64_t b = 0; b < n_seq; ++b) {
        teacher->session->reset();
        const float* l = teacher->session->eval(std::span<const int32_t>(windows + b * (n_ctx + 1), size_t(n_ctx)), true);
        std::copy(l, l + n_ctx * V, teacher_logits.begin() + b * n_ctx * V);
      }
    });
    ThreadPool* pool = s.pool.get();
    s.trainer->set_loss([&, pool](float* logits, const int32_t* targets, int64_t n, int64_t n_vocab, float scale) {
      return train::kd_loss_fused<float>(pool, kd, n, n_vocab, logits, teacher_logits.data(), targets, scale);
    });
  }
  std::fprintf(stderr, "tern distill: teacher %s, %s%s\n", teacher_path.c_str(),
               token_level ? str_cat("token-level ", train::kd_divergence_name(kd.divergence), " at T=", kd.temperature,
                                     ", hard weight ", kd.hard_weight).c_str()
                           : "hard labels only",
               n_samples > 0 ? str_cat(", ", n_samples, " teacher samples in the data").c_str() : "");
  return run_training(s, a, "tern distill");
}

}  // namespace tern
