// LLM-Pruner's gradient importance (tools/llm_pruner.h): the scores have the structures' shapes and
// are the first-order Taylor sums |w * dL/dw| over each structure's dependency group, recomputed
// here from one gradient of the same windows: the rows and columns each structure owns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <filesystem>
#include <numeric>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tools/llm_pruner.h"
#include "train/forward_backward.h"
#include "train/model.h"

namespace tern {
namespace {

using tern::testing::shared_path;

TEST(LlmPruner, ScoresAreTheTaylorSumsOverEachDependencyGroup) {
  const std::string model = shared_path("models/stories260K.gguf");
  const std::string text = shared_path("data/tinystories/tinystories_val.txt");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "../shared not present";
  LlmPrunerOptions lo;
  lo.text_file = text;
  lo.n_tokens = 1024;
  lo.n_threads = 2;
  const std::vector<LayerScores> s = llm_pruner_scores(model, lo);
  const GgufFile f = GgufFile::open(model);
  train::TrainModel m = train::load_model(f);
  ASSERT_EQ(int64_t(s.size()), m.shape.n_layer);
  for (int64_t il = 0; il < m.shape.n_layer; ++il) {
    EXPECT_EQ(int64_t(s[size_t(il)].ffn.size()), m.shape.ff_length(il));
    EXPECT_EQ(int64_t(s[size_t(il)].attn_ch.size()), m.shape.q_width(il));
    EXPECT_EQ(int64_t(s[size_t(il)].kv_group.size()), m.shape.head_count_kv(il));
    for (double v : s[size_t(il)].ffn) EXPECT_GE(v, 0.0);
  }

  // The same windows the scorer used: the text's last 1024 tokens, BOS + 128 per window.
  const auto tok = Tokenizer::from_gguf(f);
  const std::vector<int32_t> ids = tok->encode(tern::testing::read_file_bytes(text), false);
  ASSERT_GE(ids.size(), 1024u);
  ThreadPool pool(2);
  const int64_t n_ctx = 128, n_seq = 8;
  std::vector<int32_t> windows(size_t(n_seq * (n_ctx + 1)));
  for (int64_t w = 0; w < n_seq; ++w) {
    windows[size_t(w * (n_ctx + 1))] = tok->bos_id();
    std::copy_n(ids.end() - 1024 + w * n_ctx, n_ctx, windows.begin() + w * (n_ctx + 1) + 1);
  }
  // The gradient of the mean loss over the same 8 windows (the scorer averages two batches of 4).
  train::ForwardBackward fb(m.shape, n_seq, n_ctx, &pool);
  fb.prepare(m);
  std::vector<float> g(m.data.size(), 0.0f);
  fb.forward_backward(m, windows.data(), g.data(), 1.0f);
  auto param = [&](const std::string& name) -> const train::ParamInfo& {
    for (const auto& pi : m.params)
      if (pi.name == name) return pi;
    throw std::runtime_error("no " + name);
  };
  // |w g| summed over a row (r, all columns) or a column (all rows, c) of [n_rows, ne[0]].
  auto row_sum = [&](const train::ParamInfo& pi, int64_t r) {
    double t = 0;
    for (int64_t c = 0; c < pi.ne[0]; ++c) t += std::fabs(double(m.data[size_t(pi.offset + r * pi.ne[0] + c)]) * g[size_t(pi.offset + r * pi.ne[0] + c)]);
    return t;
  };
  auto col_sum = [&](const train::ParamInfo& pi, int64_t c) {
    double t = 0;
    for (int64_t r = 0; r < pi.ne[1]; ++r) t += std::fabs(double(m.data[size_t(pi.offset + r * pi.ne[0] + c)]) * g[size_t(pi.offset + r * pi.ne[0] + c)]);
    return t;
  };
  const int64_t hd = m.shape.head_dim();
  for (int64_t il = 0; il < m.shape.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t grp = m.shape.head_count(il) / m.shape.head_count_kv(il);
    for (int64_t f = 0; f < m.shape.ff_length(il); ++f) {
      const double want = row_sum(param(p + "ffn_gate.weight"), f) + row_sum(param(p + "ffn_up.weight"), f) +
                          col_sum(param(p + "ffn_down.weight"), f);
      EXPECT_NEAR(s[size_t(il)].ffn[size_t(f)], want, 1e-3 * want + 1e-9) << "layer " << il << " ffn " << f;
    }
    for (int64_t c = 0; c < m.shape.q_width(il); ++c) {
      double want = row_sum(param(p + "attn_q.weight"), c) + col_sum(param(p + "attn_output.weight"), c);
      if ((c / hd) % grp == 0) {
        const int64_t kv_row = (c / hd / grp) * hd + c % hd;
        want += row_sum(param(p + "attn_k.weight"), kv_row) + row_sum(param(p + "attn_v.weight"), kv_row);
      }
      EXPECT_NEAR(s[size_t(il)].attn_ch[size_t(c)], want, 1e-3 * want + 1e-9) << "layer " << il << " channel " << c;
    }
    double groups = 0;
    for (double v : s[size_t(il)].kv_group) groups += v;
    EXPECT_NEAR(groups, std::accumulate(s[size_t(il)].attn_ch.begin(), s[size_t(il)].attn_ch.end(), 0.0), 1e-9 * groups);
  }
}

}  // namespace
}  // namespace tern
