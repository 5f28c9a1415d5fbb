#include "tools/llm_pruner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/read_file.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "train/forward_backward.h"
#include "train/model.h"

namespace tern {
namespace {

const train::ParamInfo& param_of(const train::TrainModel& m, const std::string& name) {
  for (const auto& p : m.params)
    if (p.name == name) return p;
  fail("llm-pruner: the model has no tensor ", name);
}

}  // namespace

std::vector<LayerScores> llm_pruner_scores(const std::string& model_path, const LlmPrunerOptions& opts) {
  const GgufFile file = GgufFile::open(model_path);
  train::TrainModel model = train::load_model(file);  // f32 copies of every parameter
  const train::ModelShape& sh = model.shape;
  const std::string text = read_file_text(opts.text_file, "calibration text");
  const auto tok = Tokenizer::from_gguf(file);
  const std::vector<int32_t> ids = tok->encode(text, /*add_bos=*/false);
  if (opts.n_tokens < opts.n_ctx) fail("llm-pruner: --calib-tokens ", opts.n_tokens, " is shorter than one window of ", opts.n_ctx);
  if (int64_t(ids.size()) < opts.n_tokens)
    fail("calibration text ", opts.text_file, " is too short: ", ids.size(), " tokens, --calib-tokens asks for ",
         opts.n_tokens, " (give a longer text or fewer tokens)");

  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
  const int64_t n_ctx = std::min(opts.n_ctx, sh.n_ctx_train > 0 ? sh.n_ctx_train : opts.n_ctx);
  // Windows of BOS + n_ctx text tokens over the text's last n_tokens tokens (as calibration takes them).
  const int64_t per = n_ctx, n_win = opts.n_tokens / per, start = int64_t(ids.size()) - opts.n_tokens;
  const int64_t n_batches = (n_win + opts.n_seq - 1) / opts.n_seq;
  train::ForwardBackward fb(sh, opts.n_seq, n_ctx, &pool);
  fb.prepare(model);
  std::vector<float> grads(model.data.size(), 0.0f);  // d(mean loss)/d(params), averaged over batches
  std::vector<int32_t> batch(static_cast<size_t>(opts.n_seq * (n_ctx + 1)));  // [n_seq][n_ctx + 1]
  for (int64_t b = 0; b < n_batches; ++b) {
    for (int64_t s = 0; s < opts.n_seq; ++s) {
      // The last batch repeats windows from the start when n_win is not a multiple of n_seq.
      const int64_t w = (b * opts.n_seq + s) % n_win;
      int32_t* row = batch.data() + s * (n_ctx + 1);
      row[0] = tok->bos_id();
      std::copy(ids.begin() + start + w * per, ids.begin() + start + w * per + n_ctx, row + 1);
    }
    fb.forward_backward(model, batch.data(), grads.data(), 1.0f / float(n_batches));
    if (opts.progress) opts.progress(b + 1, n_batches, "llm-pruner gradients");
  }

  // |w * g| of a tensor's element at (row r, column c) of [n_rows, n_cols] (ne = {n_cols, n_rows}).
  auto taylor = [&](const train::ParamInfo& p, int64_t r, int64_t c) {
    const size_t i = size_t(p.offset + r * p.ne[0] + c);
    return std::fabs(double(model.data[i]) * double(grads[i]));
  };
  const int64_t E = sh.n_embd, hd = sh.head_dim();
  std::vector<LayerScores> out(static_cast<size_t>(sh.n_layer));
  for (int64_t il = 0; il < sh.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t nh = sh.head_count(il), nkv = sh.head_count_kv(il), F = sh.ff_length(il), Eq = nh * hd;
    const int64_t grp = nh / nkv;
    const auto &q = param_of(model, p + "attn_q.weight"), &k = param_of(model, p + "attn_k.weight"),
               &v = param_of(model, p + "attn_v.weight"), &o = param_of(model, p + "attn_output.weight"),
               &ga = param_of(model, p + "ffn_gate.weight"), &up = param_of(model, p + "ffn_up.weight"),
               &dn = param_of(model, p + "ffn_down.weight");
    LayerScores& s = out[size_t(il)];
    s.attn_ch.assign(size_t(Eq), 0.0);
    s.ffn.assign(size_t(F), 0.0);
    pool.parallel_for(Eq, [&](int64_t c0, int64_t c1, int) {
      for (int64_t c = c0; c < c1; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < E; ++j) sum += taylor(q, c, j) + taylor(o, j, c);
        if ((c / hd) % grp == 0) {  // the group's first query head carries its K/V rows
          const int64_t kv_row = (c / hd / grp) * hd + c % hd;
          for (int64_t j = 0; j < E; ++j) sum += taylor(k, kv_row, j) + taylor(v, kv_row, j);
        }
        s.attn_ch[size_t(c)] = sum;
      }
    });
    pool.parallel_for(F, [&](int64_t f0, int64_t f1, int) {
      for (int64_t f = f0; f < f1; ++f) {
        double sum = 0;
        for (int64_t j = 0; j < E; ++j) sum += taylor(ga, f, j) + taylor(up, f, j) + taylor(dn, j, f);
        s.ffn[size_t(f)] = sum;
      }
    });
    s.kv_group.assign(size_t(nkv), 0.0);
    for (int64_t c = 0; c < Eq; ++c) s.kv_group[size_t(c / hd / grp)] += s.attn_ch[size_t(c)];
  }
  return out;
}

void enable_llm_pruner(MethodOptions& mopts, const CalibOptions& copts) {
  mopts.gradient_scores = [copts, progress = mopts.progress](const std::string& path) {
    if (copts.text_file.empty()) fail("llm-pruner needs a calibration text: --calib FILE");
    LlmPrunerOptions lo;
    lo.text_file = copts.text_file;
    lo.n_tokens = copts.n_tokens;
    lo.n_threads = copts.n_threads;
    lo.progress = progress;
    return llm_pruner_scores(path, lo);
  };
}

}  // namespace tern
