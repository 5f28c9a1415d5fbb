#pragma once
// The predicted-sparse FFN at run time (issue #31, docs/sparsity.md "Sparse decoding"): per
// token and dense ReGLU layer, the layer's predictor (models/ffn_predictor_format.h) names the
// neurons S likely active, and the FFN computes only rows S of ffn_gate and ffn_up and rows S of
// down_t, ffn_down transposed (kernels/sparse_ffn.h). Where the predictor is right the result is
// the dense FFN's over S: a neuron it misses contributes nothing, one it adds wrongly has a gate
// <= 0 and costs its gate row alone.
//
// What it reads: gate and up straight from the model file's mapping (GGUF rows are one after
// another, what the row kernels gather; the decoder's own copies are interleaved by 16 for the
// dense GEMM, which prefill keeps using), down_t built at enable time from the file's ffn_down
// (SparseFfnConfig::down_t_type: another copy of ffn_down), and the predictor's A and B
// converted to F16 at enable time (and interleaved as the float matmul reads them).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kernels/sparse_ffn.h"
#include "models/ffn_predictor_format.h"
#include "models/neuron_store.h"

namespace tern {

struct SparseFfnConfig {
  // The file holding the predictor (`tern predictor train` writes it into a copy of the model);
  // nullptr: the model's own file.
  std::shared_ptr<const GgufFile> predictor;
  // 0: each layer's stored threshold selects (score_j > threshold). In (0, 1]: each token's top
  // `density` fraction of neurons by score (a fixed budget per token, as Deja Vu's top-k).
  double density = 0.0;
  // Steps of more tokens run the dense FFN: a prefill's GEMM reads each row once for all of its
  // tokens, where the sparse path reads the rows of every token apart. 0: every step (perplexity
  // of the sparse model).
  int64_t max_step_tokens = 8;
  // A token whose selected fraction is above this runs the dense FFN instead (a gathered row
  // costs 1.5-2x a streamed one: at 50% selected the sparse FFN about breaks even).
  double dense_above = 0.6;
  // The type of down_t, ffn_down transposed: each row is re-quantized per 32 elements across
  // down's own blocks (kernels/sparse_ffn.h build_down_t), a second rounding. Unset: down's
  // type, except Q4_0 down becomes Q8_0 (a second 4-bit rounding would cost as much accuracy as
  // the first; at 8 bits it is about the dense GEMV's own rounding of its input to Q8_0).
  std::optional<DType> down_t_type;
  // --ram-budget: bytes of the model's weights to keep in memory (0: all of them). The dense
  // ReGLU layers' gate, up and down then come from the model file's neuron bundles
  // (models/ffn_bundle_format.h) through a NeuronStore: the most frequently active neurons
  // resident, the rest read on demand into an LRU cache, in whatever the budget leaves after the
  // other weights and the predictor. Every step of every size runs sparse, and no selection falls
  // back to the dense FFN (its weights are not in memory): down_t_type and dense_above do not
  // apply; the bundles' down_t type does.
  int64_t ram_budget = 0;
  // --ram-readahead (with ram_budget): at each layer, the next layer's predictor also runs on
  // this layer's input (Deja Vu: the residual stream changes little from one layer to the next)
  // and the kernel is asked to start reading the bundles it names that are in no slot, while this
  // layer reads and computes. Costs a second predictor pass a layer; pays where the bundles come
  // from the disk.
  bool readahead = false;
};

// Counts since enable (or the last reset): per (token, layer) visit of a dense FFN.
struct SparseFfnStats {
  int64_t visits = 0;          // (token, layer) pairs that ran a dense FFN layer
  int64_t sparse_visits = 0;   // of which the sparse path ran
  int64_t neurons = 0;         // n_ff summed over the sparse visits
  int64_t selected = 0;        // neurons the predictor selected over them
  int64_t dense_fallbacks = 0; // visits whose selection was above dense_above (ran dense)
  // Seconds in the FFN layers this path covers (predictor, kernels, dense fallbacks; the dense
  // FFN where a step did not apply or the path was off): what tern bench compares.
  double ffn_seconds = 0;
  double selected_fraction() const { return neurons > 0 ? double(selected) / double(neurons) : 0.0; }
  double sparse_share() const { return visits > 0 ? double(sparse_visits) / double(visits) : 0.0; }
};

// --sparse-density's selection: the indices of the k largest of score[0..n) (of equal scores
// the lowest indices first), ascending, into out. Exact (the set a sort would give), in a few
// passes over n rather than a partition of all of them.
struct TopKScratch {
  std::vector<uint32_t> keys, cand;
  std::vector<int32_t> hist;
};
void select_top_k(const float* score, int64_t n, int64_t k, std::vector<int32_t>& out, TopKScratch& scratch);

class SparseFfn {
 public:
  // Binds the layers `layers` of `model` (dense ReGLU layers: the caller checks) and reads
  // the predictor (cfg.predictor or the model file). Throws tern::Error naming the file, tensor
  // and type: no predictor, a predictor made for another model, a gate / up / down type the row
  // kernels do not read (they read F32, F16, Q8_0, Q4_0), a density outside [0, 1].
  SparseFfn(std::shared_ptr<const GgufFile> model, const SparseFfnConfig& cfg,
            const std::vector<int64_t>& layers);

  bool has_layer(int64_t il) const { return il < int64_t(layers_.size()) && layers_[size_t(il)].w.n_ff > 0; }
  // Whether a step of T tokens runs the sparse path.
  bool step_applies(int64_t T) const {
    return enabled_ && (store_ || cfg_.max_step_tokens <= 0 || T <= cfg_.max_step_tokens);
  }
  // Off: every step runs the dense FFN (what tern bench times beside the sparse one). Not with
  // --ram-budget (tern::Error: the dense weights are not in memory).
  void set_enabled(bool on);
  bool enabled() const { return enabled_; }
  // One token of layer il: selects its neurons from xn [n_embd] (the FFN's normalised input) and
  // writes the FFN's output y [n_embd]. False (y untouched) when the selection is above
  // dense_above: the caller runs the dense FFN for this token.
  bool run(int64_t il, const float* xn, float* y, ThreadPool& pool);
  // The neurons run() selected last for layer il (ascending), for tests.
  const std::vector<int32_t>& last_selection() const { return idx_; }

  // Visits of layers that ran dense because their step did not apply (step_applies).
  void count_dense_visits(int64_t n) {
    if (enabled_) stats_.visits += n;
  }
  void add_ffn_seconds(double s) { stats_.ffn_seconds += s; }
  const SparseFfnStats& stats() const { return stats_; }
  void reset_stats() {
    stats_ = {};
    if (store_) store_->reset_stats();
  }
  // --ram-budget's neuron store (its reads and hits), nullptr without a budget.
  const NeuronStore* store() const { return store_.get(); }
  // The weights' bytes under --ram-budget: the model's own (model_weight_bytes), those the
  // budget keeps in memory besides the store (attention, embeddings, norms, output, and any
  // layer the store does not serve), and the predictor's F16 copies.
  struct BudgetBytes {
    int64_t budget = 0, model = 0, other_weights = 0, predictor = 0, store = 0, minimum = 0;
  };
  const BudgetBytes& budget_bytes() const { return budget_; }
  // Bytes this path holds beside the model: the down_t copies (the predictor and gate/up rows
  // are mapped from their files).
  int64_t extra_bytes() const;
  const SparseFfnConfig& config() const { return cfg_; }

 private:
  struct Layer {
    SparseFfnWeights w;           // gate / up into the model file; down_t into `down_t`
    std::vector<uint8_t> down_t;  // [n_ff][n_embd] in down's type
    // The predictor in F16 (half the bytes a decode step reads for it; the f32 scores move by
    // an f16 rounding of the weights), in the float matmul's layout (pred_*_w.interleaved16).
    std::vector<uint16_t> pred_a;  // [rank][n_embd]
    std::vector<uint16_t> pred_b;  // [n_ff][rank]
    WeightView pred_a_w, pred_b_w;  // views of pred_a / pred_b
    float threshold = 0.0f;
  };
  void select(const Layer& L, const float* xn, ThreadPool& pool, std::vector<int32_t>& out);
  // --ram-budget: sizes each layer's slots and opens the store (throws below the minimum).
  void open_store(const std::vector<int64_t>& layers);

  std::shared_ptr<const GgufFile> model_, predictor_file_;
  SparseFfnConfig cfg_;
  FfnPredictor pred_;
  std::vector<Layer> layers_;  // [n_layer], n_ff 0 where the layer has no sparse FFN
  std::vector<float> h_;       // [rank]  A xn
  std::vector<float> score_;   // [n_ff]  B h
  TopKScratch topk_scratch_;   // --sparse-density's selection
  std::vector<int32_t> idx_;   // the selection
  std::vector<int32_t> ahead_;  // --ram-readahead: the next layer's selection from this layer's input
  std::vector<int64_t> next_layer_;  // [n_layer] the next layer the store serves, -1 for none
  SparseFfnStats stats_;
  bool enabled_ = true;
  std::unique_ptr<NeuronStore> store_;
  BudgetBytes budget_;
};

}  // namespace tern
