// tern distill: knowledge distillation from a teacher GGUF into a student that `tern train`
// would train (a new shape or -m). Token-level (the teacher's logits at every position, computed
// on the fly: forward KL, reverse KL or their mix, plus the hard-label loss) and sequence-level
// (--teacher-samples N: the student also trains on N texts the teacher writes, which works
// across tokenizers). Feature- and relation-based terms (--loss feature=..,relation=..) add
// losses on the student's hidden states against the teacher's (train/distill_hidden.h).
// docs/training.md has the options and the figures.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/output_file.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/self_samples.h"
#include "tools/train_args.h"
#include "train/distill.h"
#include "train/distill_hidden.h"
#include "train/model.h"

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
  std::string loss_spec, feature_layers, relation_layers = "-1:-1", attention_layers = "-1:-1";
  app.add_option("--loss", loss_spec,
                 "loss terms and their weights, e.g. response=1,feature=0.5,relation=0.5 (response: the logits' loss "
                 "set by --kd/--temperature/--hard-weight; feature: hidden-state MSE; relation: token-to-token "
                 "cosine-similarity MSE; attention: KL of the attention probabilities); default response=1");
  app.add_option("--feature-layers", feature_layers,
                 "feature term: STUDENT:TEACHER layer pairs, 0-based (-1: the last), e.g. 1:2,3:5 (default: "
                 "min(layers) pairs evenly spaced, the last pairing the last layers)");
  app.add_option("--relation-layers", relation_layers, "relation term: STUDENT:TEACHER layer pairs")
      ->capture_default_str();
  app.add_option("--attention-layers", attention_layers, "attention term: STUDENT:TEACHER layer pairs")
      ->capture_default_str();
  app.add_option("--teacher-samples", n_samples, "sequence-level KD: also train on this many texts the teacher writes");
  app.add_option("--sample-len", sample_len, "tokens per teacher sample (default: --ctx)");
  app.add_option("--sample-temp", sample_temp, "sampling temperature of the teacher samples")->capture_default_str();
  app.add_option("--save-samples", save_samples, "write the teacher samples to this text file");
  float act_l1 = 0.0f;
  app.add_flag("--relufy", a.relufy,
               "ReLU-fy the student (-m): its SwiGLU FFNs become ReGLU, recovered by distillation from the teacher "
               "(docs/sparsity.md; tern sparsify --relufy does it by plain fine-tuning)");
  app.add_option("--act-l1", act_l1, "weight of an L1 penalty on the student's FFN activations (more zeros)")
      ->capture_default_str();
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  kd.divergence = train::parse_kd_divergence(kd_name);
  const train::DistillLossWeights weights =
      loss_spec.empty() ? train::DistillLossWeights{} : train::parse_distill_loss(loss_spec);
  const bool hidden = weights.hidden();
  if (!feature_layers.empty() && !(weights.feature > 0.0))
    fail("--feature-layers needs the feature term in --loss (e.g. --loss response=1,feature=0.5)");
  if (app.count("--relation-layers") > 0 && !(weights.relation > 0.0))
    fail("--relation-layers needs the relation term in --loss (e.g. --loss response=1,relation=0.5)");
  if (app.count("--attention-layers") > 0 && !(weights.attention > 0.0))
    fail("--attention-layers needs the attention term in --loss (e.g. --loss response=1,attention=0.5)");
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
  // The hidden-state terms feed the same token ids to both models: the same vocabulary too.
  if (token_level || hidden) {
    const std::string student_vocab = a.resume ? a.out : !a.model.empty() ? a.model : a.vocab_from;
    if (!student_vocab.empty()) {
      const GgufFile sv = GgufFile::open(student_vocab);
      std::string diff;
      if (first_vocab_difference(*teacher_file, sv, &diff) >= 0)
        fail(hidden ? "feature/relation/attention" : "token-level",
             " distillation needs the same vocabulary in teacher and student: ", teacher_path, " and ", student_vocab,
             " differ (", diff, "); use sequence-level distillation instead: --kd none --teacher-samples N");
    }
  }

  ModelArgs targs;
  targs.model = teacher_path;
  targs.threads = a.threads;
  std::string samples_text;
  if (n_samples > 0) {
    SampleOptions so;
    so.n_samples = n_samples;
    so.sample_len = sample_len > 0 ? sample_len : (a.n_ctx > 0 ? a.n_ctx : 256);
    so.temperature = sample_temp;
    so.seed = a.cfg.seed;
    so.threads = a.threads;
    so.progress = !a.quiet && !a.json;
    int64_t n_tokens = 0;
    samples_text = sample_documents(teacher_path, teacher_file, so, "teacher samples", &n_tokens);
    std::fprintf(stderr, "tern distill: %lld teacher samples, %lld tokens\n", static_cast<long long>(n_samples),
                 static_cast<long long>(n_tokens));
    if (!save_samples.empty()) write_output_file(save_samples, samples_text);
  }

  // The hidden-state terms run the teacher as a training model (train/distill_hidden.h says why):
  // load it before the data is tokenized, so that a teacher tern cannot train is refused early.
  train::TrainModel teacher_model;
  if (hidden) {
    try {
      teacher_model = train::load_model(*teacher_file);
    } catch (const Error& e) {
      fail("feature/relation/attention distillation runs the teacher as a training model (a Llama-family GGUF): ",
           e.what());
    }
  }

  TrainSetup s = setup_training(app, a, "tern distill", false, n_samples > 0 ? &samples_text : nullptr);
  s.trainer->forward_backward().set_activation_l1(act_l1);
  if ((token_level || hidden) && a.vocab_from.empty() && a.model.empty() && !a.resume) fail("tern distill: no student");

  std::unique_ptr<LoadedSession> teacher;
  std::vector<float> teacher_logits;
  std::unique_ptr<train::HiddenDistill> hd;
  const double w_response = weights.response;
  std::string terms;
  if (hidden) {
    const int64_t n_s = s.model.shape.n_layer, n_t = teacher_model.shape.n_layer;
    train::HiddenDistillConfig hc;
    hc.feature_weight = weights.feature;
    hc.relation_weight = weights.relation;
    if (weights.feature > 0.0)
      hc.feature_pairs = feature_layers.empty() ? train::default_feature_pairs(n_s, n_t)
                                                : train::parse_layer_pairs(feature_layers, n_s, n_t, "--feature-layers");
    if (weights.relation > 0.0)
      hc.relation_pairs = train::parse_layer_pairs(relation_layers, n_s, n_t, "--relation-layers");
    hc.attention_weight = weights.attention;
    if (weights.attention > 0.0)
      hc.attention_pairs = train::parse_layer_pairs(attention_layers, n_s, n_t, "--attention-layers");
    terms = str_cat("--loss response=", w_response);
    if (weights.feature > 0.0)
      terms += str_cat(", feature=", weights.feature, " (layers ", train::describe_pairs(hc.feature_pairs),
                       s.model.shape.n_embd == teacher_model.shape.n_embd
                           ? std::string(", no projection")
                           : str_cat(", projection ", s.model.shape.n_embd, " -> ", teacher_model.shape.n_embd),
                       ")");
    if (weights.relation > 0.0)
      terms += str_cat(", relation=", weights.relation, " (layers ", train::describe_pairs(hc.relation_pairs), ")");
    if (weights.attention > 0.0)
      terms += str_cat(", attention=", weights.attention, " (layers ", train::describe_pairs(hc.attention_pairs), ")");
    hc.opt = a.cfg.opt;
    hc.opt.total_steps = a.cfg.steps;
    hc.grad_accum = a.cfg.grad_accum;
    hc.first_step = s.trainer->step();
    hc.seed = a.cfg.seed;
    hd = std::make_unique<train::HiddenDistill>(std::move(hc), std::move(teacher_model), s.model.shape, a.cfg.n_seq,
                                                a.cfg.n_ctx, s.pool.get());
    hd->attach(s.trainer->forward_backward());
    // One teacher forward per micro-batch gives the hidden states and the response term's logits.
    s.trainer->set_before_batch([&](const int32_t* windows, int64_t, int64_t) { hd->teacher_forward(windows); });
    // The feature projections are run state: checkpointed in OUT.optim, restored on --resume.
    s.trainer->set_checkpoint_extra([&hd](GgufWriter& w) { hd->save_state(w); });
    if (a.resume) hd->restore_state(GgufFile::open(train::optimizer_state_path(a.out)));
  } else if (token_level) {
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
  }
  if (token_level || hidden) {
    // The response term (soft KD + hard labels, or hard labels alone with --kd none), weighted.
    ThreadPool* pool = s.pool.get();
    s.trainer->set_loss([&, pool](float* logits, const int32_t* targets, int64_t n, int64_t n_vocab, float scale) {
      const float* zt = hd != nullptr ? hd->teacher_logits() : teacher_logits.data();
      return w_response * train::kd_loss_fused<float>(pool, kd, n, n_vocab, logits, zt, targets,
                                                      float(w_response) * scale);
    });
  }
  std::fprintf(stderr, "tern distill: teacher %s, %s%s\n", teacher_path.c_str(),
               token_level ? str_cat("token-level ", train::kd_divergence_name(kd.divergence), " at T=", kd.temperature,
                                     ", hard weight ", kd.hard_weight).c_str()
                           : "hard labels only",
               n_samples > 0 ? str_cat(", ", n_samples, " teacher samples in the data").c_str() : "");
  if (!terms.empty()) std::fprintf(stderr, "tern distill: %s\n", terms.c_str());
  return run_training(s, a, "tern distill");
}

}  // namespace tern
