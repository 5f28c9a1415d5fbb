#include "train/forward_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant_traits.h"
#include "train/attention.h"
#include "train/gemm.h"
#include "train/lora.h"
#include "train/ops.h"
#include "train/rng.h"

namespace tern::train {
namespace {

void resize(std::vector<float>& v, int64_t n) { v.assign(size_t(n), 0.0f); }

}  // namespace

// y [n][e] += b [e] on every row (an output projection's bias).
void ForwardBackward::add_bias(int64_t n, int64_t e, const float* b, float* y) {
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < e; ++j) y[i * e + j] += b[j];
  };
  if (pool_ != nullptr) pool_->parallel_for(n, [&](int64_t r0, int64_t r1, int) { rows(r0, r1); });
  else rows(0, n);
}

// gb [e] += sum over the n rows of dy [n][e]: each column summed in row order in double by one
// thread (split by columns), so the bits do not depend on the thread count.
void ForwardBackward::bias_backward(int64_t n, int64_t e, const float* dy, float* gb) {
  auto cols = [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(size_t(c1 - c0), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = c0; j < c1; ++j) acc[size_t(j - c0)] += double(dy[i * e + j]);
    for (int64_t j = c0; j < c1; ++j) gb[j] += float(acc[size_t(j - c0)]);
  };
  if (pool_ != nullptr) pool_->parallel_for(e, [&](int64_t c0, int64_t c1, int) { cols(c0, c1); });
  else cols(0, e);
}

ForwardBackward::ForwardBackward(const ModelShape& shape, int64_t n_seq, int64_t n_ctx, ThreadPool* pool)
    : shape_(shape), n_seq_(n_seq), n_ctx_(n_ctx), n_tok_(n_seq * n_ctx), pool_(pool) {
  if (n_seq <= 0 || n_ctx <= 0) fail("training batch: need at least one sequence of one token (got ", n_seq, " x ", n_ctx, ")");
  const int64_t N = n_tok_, E = shape.n_embd;
  // The backward scratch serves every layer: sized for the widest (a pruned model's layers differ).
  int64_t qw_max = 0, kvw_max = 0, F_max = 0;
  for (int64_t il = 0; il < shape.n_layer; ++il) {
    qw_max = std::max(qw_max, shape.q_width(il));
    kvw_max = std::max(kvw_max, shape.kv_width(il));
    F_max = std::max(F_max, shape.ff_length(il));
  }
  inputs_.assign(size_t(N), 0);
  targets_.assign(size_t(N), 0);
  acts_.resize(size_t(shape.n_layer));
  for (int64_t il = 0; il < shape.n_layer; ++il) {
    // Each layer's activations at its own widths.
    LayerActs& a = acts_[size_t(il)];
    const int64_t qw = shape.q_width(il), kvw = shape.kv_width(il), F = shape.ff_length(il);
    resize(a.x, N * E);
    resize(a.h1, N * E);
    resize(a.rstd1, N);
    resize(a.q, N * qw);
    resize(a.k, N * kvw);
    resize(a.v, N * kvw);
    resize(a.o, N * qw);
    resize(a.lse, N * shape.head_count(il));
    resize(a.x_mid, N * E);
    resize(a.h2, N * E);
    resize(a.rstd2, N);
    resize(a.gate, N * F);
    resize(a.up, N * F);
    resize(a.gate_sig, N * F);
    resize(a.act, N * F);
  }
  resize(x_final_, N * E);
  resize(h_final_, N * E);
  resize(rstd_final_, N);
  resize(logits_, N * shape.n_vocab);
  resize(dx_, N * E);
  resize(dh_, N * E);
  resize(dq_, N * qw_max);
  resize(dk_, N * kvw_max);
  resize(dv_, N * kvw_max);
  resize(do_, N * qw_max);
  resize(dact_, N * F_max);
  resize(dgate_, N * F_max);
  resize(dup_, N * F_max);
}

void ForwardBackward::prepare(const TrainModel& m) {
  if (!m.shape.same_architecture(shape_)) fail("training batch: the model's shape changed (", m.shape.describe(), ")");
  // Every matrix the forward multiplies by: the layers' and the output (token_embd when tied).
  // Encoded ones (a QLoRA base) get no copy: their tiles are dequantized where they are used.
  weight_t_offset_.assign(m.params.size(), -1);
  int64_t total = 0, tile = 0, tile_t = 0, x_t = 0;
  trained_mac_per_token_ = 0.0;  // set_trained_weights: the dW products the backward runs
  for (const ParamInfo& p : m.params)
    if (p.ne.size() == 2 && p.offset != m.tok_embd && std::binary_search(trained_.begin(), trained_.end(), p.offset))
      trained_mac_per_token_ += double(p.size);
  if (m.shape.tied_output && std::binary_search(trained_.begin(), trained_.end(), m.tok_embd))
    trained_mac_per_token_ += double(m.shape.n_embd) * double(m.shape.n_vocab);
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamInfo& p = m.params[i];
    if (p.ne.size() != 2) continue;
    if (p.offset == m.tok_embd && !m.shape.tied_output) continue;  // only gathered from
    if (TrainModel::is_encoded(p.offset)) {
      const EncodedTensor& e = m.encoded_at(p.offset);
      tile = std::max(tile, tile_rows(e) * e.cols);
      if (forward_by_x_t(e)) {
        tile_t = std::max(tile_t, tile_rows(e) * n_tok_);
        x_t = std::max(x_t, e.cols * n_tok_);
      } else {
        tile_t = std::max(tile_t, tile_rows(e) * e.cols);
      }
      continue;
    }
    weight_t_offset_[i] = total;
    total += p.size;
  }
  if (int64_t(weights_t_.size()) != total) weights_t_.assign(size_t(total), 0.0f);
  if (int64_t(tile_.size()) != tile) tile_.assign(size_t(tile), 0.0f);
  if (int64_t(tile_t_.size()) != tile_t) tile_t_.assign(size_t(tile_t), 0.0f);
  if (int64_t(x_t_.size()) != x_t) x_t_.assign(size_t(x_t), 0.0f);
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (weight_t_offset_[i] < 0) continue;
    const ParamInfo& p = m.params[i];
    // W [out = ne[1]][in = ne[0]] -> W^T [in][out]
    transpose(pool_, p.ne[1], p.ne[0], m.data.data() + p.offset, p.ne[0], weights_t_.data() + weight_t_offset_[i],
              p.ne[1]);
  }
}

int64_t ForwardBackward::tile_rows(const EncodedTensor& e) const {
  if (tile_rows_ > 0) return std::min(tile_rows_, e.rows);
  // About 1M floats (4 MB) per tile, in multiples of 32 rows: big enough that gemm still has
  // many register tiles to share out and the per-tile dispatch is noise, small enough for L2/L3.
  constexpr int64_t kTileFloats = int64_t(1) << 20;
  const int64_t r = std::clamp<int64_t>(kTileFloats / std::max<int64_t>(e.cols, 1) / 32 * 32, 32, 1024);
  return std::min(r, e.rows);
}

bool ForwardBackward::forward_by_x_t(const EncodedTensor& e) const {
  // Two ways to y[:, tile] = x Wtile^T with gemm's row-major B: transpose every W tile ([in][R]:
  // rows * cols floats per forward), or transpose x once ([in][n]) and compute y's tile
  // transposed, Wtile x^T, then put it in place (with y's old values first when accumulating:
  // up to 2 n rows floats). The fewer moved floats win: x^T whenever the batch is small next
  // to the matrix. Both give the same bits (one FMA chain over k per element, the operands of
  // each product swapped: fma(a, b, c) == fma(b, a, c)).
  return n_tok_ * (e.cols + 2 * e.rows) < e.rows * e.cols;
}

ForwardBackward::Linear ForwardBackward::linear_of(const TrainModel& m, int64_t offset) const {
  Linear l;
  if (TrainModel::is_encoded(offset)) {
    l.enc = &m.encoded_at(offset);
    return l;
  }
  for (size_t i = 0; i < m.params.size(); ++i)
    if (m.params[i].offset == offset && weight_t_offset_[i] >= 0) {
      l.wt = weights_t_.data() + weight_t_offset_[i];
      l.w = m.data.data() + offset;
      return l;
    }
  fail("training batch: no transposed copy of the weight at ", offset);
}

const QuantTraits& ForwardBackward::check_encoded(const EncodedTensor& e, int64_t in, int64_t out) const {
  if (e.cols != in || e.rows != out)
    fail("training batch: encoded weight is ", e.rows, " x ", e.cols, ", the linear needs ", out, " x ", in);
  if (int64_t(tile_.size()) < tile_rows(e) * in)
    fail("training batch: prepare() was not called for this model (or set_tile_rows after it)");
  return require_quant_traits(e.type, "frozen base matrix");
}

void ForwardBackward::dequantize_tile(const EncodedTensor& e, const QuantTraits& q, int64_t o0, int64_t r) {
  float* t = tile_.data();
  auto rows = [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) q.to_float(e.bytes + (o0 + i) * e.row_bytes, t + i * e.cols, e.cols);
  };
  if (pool_ != nullptr) pool_->parallel_for(r, [&](int64_t b, int64_t end, int) { rows(b, end); });
  else rows(0, r);
}

void ForwardBackward::linear_forward(int64_t in, int64_t out, const float* x, const Linear& w, float* y,
                                     bool accumulate) {
  const int64_t n = n_tok_;
  if (w.enc == nullptr) {
    gemm(pool_, false, n, out, in, x, in, w.wt, out, y, out, accumulate);
    return;
  }
  // y[:, o0:o0+R] (+)= x Wtile^T, tile by tile of W's rows, written into that column range of y
  // (ldc = out). Each y element is the same FMA chain over in as with the whole W^T, so the
  // bits equal the f32 model's.
  const EncodedTensor& e = *w.enc;
  const QuantTraits& q = check_encoded(e, in, out);
  const int64_t R = tile_rows(e);
  const bool by_x_t = forward_by_x_t(e);
  if (by_x_t) {
    if (int64_t(x_t_.size()) < in * n || int64_t(tile_t_.size()) < R * n)
      fail("training batch: prepare() was not called for this model");
    transpose(pool_, n, in, x, in, x_t_.data(), n);
  }
  for (int64_t o0 = 0; o0 < out; o0 += R) {
    const int64_t r = std::min(R, out - o0);
    dequantize_tile(e, q, o0, r);
    if (by_x_t) {
      // y^T tile [r][n] = Wtile x^T (+ y's tile transposed)
      if (accumulate) transpose(pool_, n, r, y + o0, out, tile_t_.data(), n);
      gemm(pool_, false, r, n, in, tile_.data(), in, x_t_.data(), n, tile_t_.data(), n, accumulate);
      transpose(pool_, r, n, tile_t_.data(), n, y + o0, out);
    } else {
      transpose(pool_, r, in, tile_.data(), in, tile_t_.data(), r);
      gemm(pool_, false, n, r, in, x, in, tile_t_.data(), r, y + o0, out, accumulate);
    }
  }
}

void ForwardBackward::linear_backward(int64_t in, int64_t out, const float* x, const Linear& w, const float* dy,
                                      float* dx, bool accumulate_dx, float* dw) {
  const int64_t n = n_tok_;
  if (w.enc == nullptr) {
    gemm(pool_, false, n, in, out, dy, out, w.w, in, dx, in, accumulate_dx);
    if (dw != nullptr) gemm(pool_, true, out, in, n, dy, out, x, in, dw, in, true);
    return;
  }
  if (dw != nullptr) fail("training batch: an encoded (frozen) base matrix has no gradient; train a LoRA adapter");
  // dx (+)= sum over tiles of dy[:, o0:o0+R] Wtile: consecutive K ranges of one product; gemm
  // continues each dx element's FMA chain from the stored f32 sum, so the bits equal the f32
  // model's single product. Wtile [R][in] is gemm's B as it is: no transpose.
  const EncodedTensor& e = *w.enc;
  const QuantTraits& q = check_encoded(e, in, out);
  const int64_t R = tile_rows(e);
  for (int64_t o0 = 0; o0 < out; o0 += R) {
    const int64_t r = std::min(R, out - o0);
    dequantize_tile(e, q, o0, r);
    gemm(pool_, false, n, in, r, dy + o0, out, tile_.data(), in, dx, in, accumulate_dx || o0 > 0);
  }
}

void ForwardBackward::set_trained_weights(std::vector<int64_t> offsets) {
  if (!offsets.empty() && lora_ != nullptr) fail("training batch: a LoRA adapter and a subset of trained weights");
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  trained_ = std::move(offsets);
  if (!trained_.empty()) resize(norm_scratch_, shape_.n_embd);  // the frozen norms' gradients go there
}

void ForwardBackward::set_lora(const LoraWeights* lora) {
  if (lora != nullptr && !trained_.empty()) fail("training batch: a LoRA adapter and a subset of trained weights");
  lora_ = lora;
  lora_acts_.clear();
  lora_t_.clear();
  if (lora == nullptr) return;
  const int64_t N = n_tok_;
  int64_t max_in = 0;
  lora_acts_.resize(lora->slots.size());
  for (size_t i = 0; i < lora->slots.size(); ++i) {
    const LoraSlot& sl = lora->slots[i];
    if (sl.layer >= shape_.n_layer || (sl.layer < 0 && sl.kind != LoraKind::Output))
      fail("LoRA adapter: ", sl.target, " is not in this model (", shape_.describe(), ")");
    resize(lora_acts_[i].u, N * lora->rank);
    if (lora->dropout > 0.0f) {
      resize(lora_acts_[i].xd, N * sl.n_in);
      lora_acts_[i].keep.assign(size_t(N * sl.n_in), 0);
    }
    max_in = std::max(max_in, sl.n_in);
  }
  lora_t_.assign(lora->data.size(), 0.0f);
  resize(lora_du_, N * lora->rank);
  resize(lora_dx_, N * max_in);
  resize(norm_scratch_, shape_.n_embd);
}

void ForwardBackward::prepare_lora() {
  if (lora_ == nullptr) return;
  if (lora_t_.size() != lora_->data.size()) fail("LoRA adapter: its size changed after set_lora()");
  const int64_t r = lora_->rank;
  for (const LoraSlot& sl : lora_->slots) {
    // A [r][n_in] -> A^T [n_in][r];  B [n_out][r] -> B^T [r][n_out]
    transpose(pool_, r, sl.n_in, lora_->data.data() + sl.a, sl.n_in, lora_t_.data() + sl.a, r);
    transpose(pool_, sl.n_out, r, lora_->data.data() + sl.b, r, lora_t_.data() + sl.b, sl.n_out);
  }
}

void ForwardBackward::lora_forward(int64_t layer, int kind, const float* x, float* y, bool train) {
  if (lora_ == nullptr) return;
  const LoraSlot* sl = lora_->find(layer, LoraKind(kind));
  if (sl == nullptr) return;
  LoraActs& la = lora_acts_[size_t(sl - lora_->slots.data())];
  const int64_t N = n_tok_, r = lora_->rank, n_in = sl->n_in;
  const float* xin = x;
  la.dropped = train && lora_->dropout > 0.0f;
  if (la.dropped) {
    // Row i's mask from its own stream: the same bits for any thread count.
    const float p = lora_->dropout, keep_scale = 1.0f / (1.0f - p);
    const uint64_t slot_seed = mix_seed(dropout_seed_, 5, uint64_t(sl - lora_->slots.data()));
    auto rows = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Rng rng(mix_seed(slot_seed, 6, uint64_t(i)));
        for (int64_t j = 0; j < n_in; ++j) {
          const bool keep = rng.uniform() >= double(p);
          la.keep[size_t(i * n_in + j)] = keep;
          la.xd[size_t(i * n_in + j)] = keep ? x[i * n_in + j] * keep_scale : 0.0f;
        }
      }
    };
    if (pool_ != nullptr) pool_->parallel_for(N, [&](int64_t b, int64_t e, int) { rows(b, e); });
    else rows(0, N);
    xin = la.xd.data();
  }
  // u = s * xin A^T;  y += u B^T
  gemm(pool_, false, N, r, n_in, xin, n_in, lora_t_.data() + sl->a, r, la.u.data(), r, false);
  const float s = lora_->scale();
  for (float& v : la.u) v *= s;
  gemm(pool_, false, N, sl->n_out, r, la.u.data(), r, lora_t_.data() + sl->b, sl->n_out, y, sl->n_out, true);
}

void ForwardBackward::lora_backward(int64_t layer, int kind, const float* x, const float* dy, float* dx, float* g) {
  if (lora_ == nullptr) return;
  const LoraSlot* sl = lora_->find(layer, LoraKind(kind));
  if (sl == nullptr) return;
  const LoraActs& la = lora_acts_[size_t(sl - lora_->slots.data())];
  const int64_t N = n_tok_, r = lora_->rank, n_in = sl->n_in, n_out = sl->n_out;
  const float* A = lora_->data.data() + sl->a;
  const float* B = lora_->data.data() + sl->b;
  const float* xin = la.dropped ? la.xd.data() : x;
  // dB [n_out][r] += dy^T u
  gemm(pool_, true, n_out, r, N, dy, n_out, la.u.data(), r, g + sl->b, r, true);
  // du = s * dy B  [N][r]
  gemm(pool_, false, N, r, n_out, dy, n_out, B, r, lora_du_.data(), r, false);
  const float s = lora_->scale();
  for (int64_t i = 0; i < N * r; ++i) lora_du_[size_t(i)] *= s;
  // dA [r][n_in] += du^T xin
  gemm(pool_, true, r, n_in, N, lora_du_.data(), r, xin, n_in, g + sl->a, n_in, true);
  // dx += (du A) * keep / (1 - p)
  if (!la.dropped) {
    gemm(pool_, false, N, n_in, r, lora_du_.data(), r, A, n_in, dx, n_in, true);
    return;
  }
  gemm(pool_, false, N, n_in, r, lora_du_.data(), r, A, n_in, lora_dx_.data(), n_in, false);
  const float keep_scale = 1.0f / (1.0f - lora_->dropout);
  for (int64_t i = 0; i < N * n_in; ++i)
    if (la.keep[size_t(i)]) dx[i] += lora_dx_[size_t(i)] * keep_scale;
}

void ForwardBackward::forward(const TrainModel& m, const int32_t* windows, bool train) {
  if (weight_t_offset_.size() != m.params.size()) fail("training batch: prepare() was not called");
  if (lora_ != nullptr && lora_t_.size() != lora_->data.size()) fail("training batch: prepare_lora() was not called");
  const int64_t N = n_tok_, E = shape_.n_embd, hd = shape_.head_dim(), V = shape_.n_vocab;
  n_scored_ = 0;
  for (int64_t s = 0; s < n_seq_; ++s) {
    const int32_t* w = windows + s * (n_ctx_ + 1);
    for (int64_t t = 0; t < n_ctx_; ++t) {
      const int32_t in = token_of_entry(w[t]), tg = w[t + 1] == -1 ? -1 : token_of_entry(w[t + 1]);
      if (w[t] == -1 || in >= V || tg >= V)
        fail("training batch: token id ", w[t] == -1 || in >= V ? w[t] : tg, " outside the vocabulary of ", V);
      inputs_[size_t(s * n_ctx_ + t)] = in;
      targets_[size_t(s * n_ctx_ + t)] = w[t + 1] >= 0 ? w[t + 1] : -1;
      n_scored_ += w[t + 1] >= 0;
    }
  }
  auto wt = [&](int64_t offset) { return linear_of(m, offset); };
  const float* P = m.data.data();

  if (!TrainModel::is_encoded(m.tok_embd)) {
    embedding_forward<float>(pool_, N, E, inputs_.data(), P + m.tok_embd, acts_[0].x.data());
  } else {
    // The looked-up rows only, dequantized: the values of the dequantized table.
    const EncodedTensor& e = m.encoded_at(m.tok_embd);
    const QuantTraits& q = require_quant_traits(e.type, "token_embd.weight");
    float* x0 = acts_[0].x.data();
    auto rows = [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) q.to_float(e.bytes + int64_t(inputs_[size_t(i)]) * e.row_bytes, x0 + i * E, E);
    };
    if (pool_ != nullptr) pool_->parallel_for(N, [&](int64_t b, int64_t end, int) { rows(b, end); });
    else rows(0, N);
  }
  for (int64_t il = 0; il < shape_.n_layer; ++il) {
    LayerActs& a = acts_[size_t(il)];
    const LayerOffsets& l = m.layers[size_t(il)];
    const int64_t nh = shape_.head_count(il), nkv = shape_.head_count_kv(il);
    const int64_t qw = nh * hd, kvw = nkv * hd, F = shape_.ff_length(il);
    const AttentionShape as{n_seq_, n_ctx_, nh, nkv, hd, float(1.0 / std::sqrt(double(hd)))};
    rmsnorm_forward<float>(pool_, N, E, a.x.data(), P + l.attn_norm, shape_.rms_eps, a.h1.data(), a.rstd1.data());
    linear_forward(E, qw, a.h1.data(), wt(l.wq), a.q.data(), false);
    linear_forward(E, kvw, a.h1.data(), wt(l.wk), a.k.data(), false);
    linear_forward(E, kvw, a.h1.data(), wt(l.wv), a.v.data(), false);
    lora_forward(il, int(LoraKind::Q), a.h1.data(), a.q.data(), train);
    lora_forward(il, int(LoraKind::K), a.h1.data(), a.k.data(), train);
    lora_forward(il, int(LoraKind::V), a.h1.data(), a.v.data(), train);
    rope_rotate<float>(pool_, N, n_ctx_, nh, hd, shape_.rope_freq_base, a.q.data(), false);
    rope_rotate<float>(pool_, N, n_ctx_, nkv, hd, shape_.rope_freq_base, a.k.data(), false);
    attention_forward(pool_, as, a.q.data(), a.k.data(), a.v.data(), a.o.data(), a.lse.data());
    std::memcpy(a.x_mid.data(), a.x.data(), size_t(N * E) * sizeof(float));
    linear_forward(qw, E, a.o.data(), wt(l.wo), a.x_mid.data(), true);
    lora_forward(il, int(LoraKind::O), a.o.data(), a.x_mid.data(), train);
    if (l.bo != LayerOffsets::kAbsent) add_bias(N, E, P + l.bo, a.x_mid.data());
    rmsnorm_forward<float>(pool_, N, E, a.x_mid.data(), P + l.ffn_norm, shape_.rms_eps, a.h2.data(), a.rstd2.data());
    linear_forward(E, F, a.h2.data(), wt(l.w_gate), a.gate.data(), false);
    linear_forward(E, F, a.h2.data(), wt(l.w_up), a.up.data(), false);
    lora_forward(il, int(LoraKind::Gate), a.h2.data(), a.gate.data(), train);
    lora_forward(il, int(LoraKind::Up), a.h2.data(), a.up.data(), train);
    // gate_sig: sigmoid(gate) for SwiGLU's backward, the on/off mask for ReGLU's.
    if (shape_.ffn_relu) reglu_forward<float>(pool_, N * F, a.gate.data(), a.up.data(), a.act.data(), a.gate_sig.data());
    else swiglu_forward<float>(pool_, N * F, a.gate.data(), a.up.data(), a.act.data(), a.gate_sig.data());
    float* next = il + 1 < shape_.n_layer ? acts_[size_t(il + 1)].x.data() : x_final_.data();
    std::memcpy(next, a.x_mid.data(), size_t(N * E) * sizeof(float));
    linear_forward(F, E, a.act.data(), wt(l.w_down), next, true);
    lora_forward(il, int(LoraKind::Down), a.act.data(), next, train);
    if (l.b_down != LayerOffsets::kAbsent) add_bias(N, E, P + l.b_down, next);
  }
  rmsnorm_forward<float>(pool_, N, E, x_final_.data(), P + m.output_norm, shape_.rms_eps, h_final_.data(),
                         rstd_final_.data());
  linear_forward(E, V, h_final_.data(), wt(m.output), logits_.data(), false);
  lora_forward(-1, int(LoraKind::Output), h_final_.data(), logits_.data(), train);
}

void ForwardBackward::set_activation_l1(float lambda) {
  if (!(lambda >= 0.0f) || !std::isfinite(lambda)) fail("the activation L1 weight must be a finite number >= 0 (got ", lambda, ")");
  act_l1_ = lambda;
}

void ForwardBackward::set_hidden_loss(std::vector<int64_t> layers, HiddenLossFn fn) {
  hidden_layers_.clear();
  hidden_grads_.clear();
  hidden_fn_ = nullptr;
  if (layers.empty() || !fn) return;
  for (int64_t il : layers)
    if (il < 0 || il >= shape_.n_layer)
      fail("hidden-state loss: layer ", il, " is out of range (the model has ", shape_.n_layer, " layers: 0..",
           shape_.n_layer - 1, ")");
  hidden_layers_ = std::move(layers);
  hidden_fn_ = std::move(fn);
  hidden_grads_.resize(hidden_layers_.size());
  for (auto& g : hidden_grads_) resize(g, n_tok_ * shape_.n_embd);
}

const float* ForwardBackward::layer_output(int64_t il) const {
  if (il < 0 || il >= shape_.n_layer)
    fail("layer output: layer ", il, " is out of range (the model has ", shape_.n_layer, " layers: 0..", shape_.n_layer - 1,
         ")");
  return il + 1 < shape_.n_layer ? acts_[size_t(il + 1)].x.data() : x_final_.data();
}

void ForwardBackward::set_attention_loss(std::vector<int64_t> layers, AttentionLossFn fn) {
  attn_layers_.clear();
  attn_dq_.clear();
  attn_dk_.clear();
  attn_fn_ = nullptr;
  if (layers.empty() || !fn) return;
  for (int64_t il : layers)
    if (il < 0 || il >= shape_.n_layer)
      fail("attention loss: layer ", il, " is out of range (the model has ", shape_.n_layer, " layers: 0..",
           shape_.n_layer - 1, ")");
  attn_layers_ = std::move(layers);
  attn_fn_ = std::move(fn);
  attn_dq_.resize(attn_layers_.size());
  attn_dk_.resize(attn_layers_.size());
  for (size_t i = 0; i < attn_layers_.size(); ++i) {
    resize(attn_dq_[i], n_tok_ * shape_.q_width(attn_layers_[i]));
    resize(attn_dk_[i], n_tok_ * shape_.kv_width(attn_layers_[i]));
  }
}

const float* ForwardBackward::layer_q(int64_t il) const {
  if (il < 0 || il >= shape_.n_layer) fail("layer queries: layer ", il, " is out of range");
  return acts_[size_t(il)].q.data();
}

const float* ForwardBackward::layer_k(int64_t il) const {
  if (il < 0 || il >= shape_.n_layer) fail("layer keys: layer ", il, " is out of range");
  return acts_[size_t(il)].k.data();
}

double ForwardBackward::forward_loss(const TrainModel& m, const int32_t* windows) {
  forward(m, windows, false);
  if (n_scored_ == 0) return 0.0;
  return cross_entropy_loss<float>(pool_, n_tok_, shape_.n_vocab, logits_.data(), targets_.data()) / double(n_scored_);
}

double ForwardBackward::activation_l1_penalty(const TrainModel& m, const int32_t* windows) {
  forward(m, windows, false);
  double sum = 0.0;
  for (int64_t il = 0; il < shape_.n_layer; ++il) {
    const float* act = acts_[size_t(il)].act.data();
    const int64_t F = shape_.ff_length(il);
    double layer = 0.0;
    for (int64_t i = 0; i < n_tok_ * F; ++i) layer += std::fabs(double(act[i]));
    sum += layer / double(F);
  }
  return double(act_l1_) * sum / double(n_scored_ > 0 ? n_scored_ : 1);
}

double ForwardBackward::forward_backward(const TrainModel& m, const int32_t* windows, float* g, float grad_scale,
                                         const LossFn* loss_fn) {
  forward(m, windows, true);
  const int64_t N = n_tok_, E = shape_.n_embd, hd = shape_.head_dim(), V = shape_.n_vocab;
  const int64_t n_mean = n_scored_ > 0 ? n_scored_ : 1;
  const float scale = grad_scale / float(n_mean);
  double loss_sum = loss_fn != nullptr ? (*loss_fn)(logits_.data(), targets_.data(), N, V, scale)
                                       : cross_entropy_fused<float>(pool_, N, V, logits_.data(), targets_.data(), scale);
  if (hidden_fn_) {
    // Before the backward, which reads the states (acts_[il].x, x_final_) but never writes them:
    // every injected gradient must exist when the backward reaches its layer.
    std::vector<const float*> states;
    std::vector<float*> grads;
    for (size_t i = 0; i < hidden_layers_.size(); ++i) {
      states.push_back(layer_output(hidden_layers_[i]));
      std::fill(hidden_grads_[i].begin(), hidden_grads_[i].end(), 0.0f);
      grads.push_back(hidden_grads_[i].data());
    }
    loss_sum += hidden_fn_(states, grads, N, E, scale);
  }
  if (attn_fn_) {
    std::vector<const float*> q, k;
    std::vector<float*> dq, dk;
    for (size_t i = 0; i < attn_layers_.size(); ++i) {
      q.push_back(layer_q(attn_layers_[i]));
      k.push_back(layer_k(attn_layers_[i]));
      std::fill(attn_dq_[i].begin(), attn_dq_[i].end(), 0.0f);
      std::fill(attn_dk_[i].begin(), attn_dk_[i].end(), 0.0f);
      dq.push_back(attn_dq_[i].data());
      dk.push_back(attn_dk_[i].data());
    }
    loss_sum += attn_fn_(q, k, dq, dk, scale);
  }
  // dq, dk (after RoPE) of layer il get the attention loss's gradient.
  auto add_attention_grad = [&](int64_t il) {
    for (size_t i = 0; i < attn_layers_.size(); ++i) {
      if (attn_layers_[i] != il) continue;
      for (size_t j = 0; j < attn_dq_[i].size(); ++j) dq_[j] += attn_dq_[i][j];
      for (size_t j = 0; j < attn_dk_[i].size(); ++j) dk_[j] += attn_dk_[i][j];
    }
  };
  // d(layer il's output) gets the hidden loss's gradient on top of what flows back from above.
  auto add_hidden_grad = [&](int64_t il) {
    for (size_t i = 0; i < hidden_layers_.size(); ++i) {
      if (hidden_layers_[i] != il) continue;
      const float* gh = hidden_grads_[i].data();
      float* d = dx_.data();
      for (int64_t j = 0; j < N * E; ++j) d[j] += gh[j];
    }
  };
  const float* P = m.data.data();
  // The base's gradients: into g (its layout), or nowhere when a LoRA adapter is trained (the
  // dW products skipped; the norms' small gradients go to scratch, as their input gradient is
  // computed with them).
  // set_trained_weights: only the listed matrices' dW (the rest frozen as under LoRA).
  const bool frozen = lora_ != nullptr || !trained_.empty();
  if (lora_ == nullptr && !m.encoded.empty())
    fail("training batch: the base keeps ", m.encoded.size(), " matrices encoded (frozen); it trains only a LoRA adapter");
  auto lin = [&](int64_t offset) { return linear_of(m, offset); };
  float* gl = lora_ != nullptr ? g : nullptr;
  auto wanted = [&](int64_t off) { return !frozen || std::binary_search(trained_.begin(), trained_.end(), off); };
  auto gw = [&](int64_t off) { return wanted(off) ? g + off : nullptr; };
  auto gn = [&](int64_t off) {
    if (!frozen) return g + off;
    std::fill(norm_scratch_.begin(), norm_scratch_.end(), 0.0f);
    return norm_scratch_.data();
  };

  // logits = h_final W_out^T
  linear_backward(E, V, h_final_.data(), lin(m.output), logits_.data(), dh_.data(), false, gw(m.output));
  lora_backward(-1, int(LoraKind::Output), h_final_.data(), logits_.data(), dh_.data(), gl);
  rmsnorm_backward<float>(pool_, N, E, x_final_.data(), P + m.output_norm, rstd_final_.data(), dh_.data(), dx_.data(),
                          gn(m.output_norm), false);
  for (int64_t il = shape_.n_layer - 1; il >= 0; --il) {
    LayerActs& a = acts_[size_t(il)];
    const LayerOffsets& l = m.layers[size_t(il)];
    const int64_t nh = shape_.head_count(il), nkv = shape_.head_count_kv(il);
    const int64_t qw = nh * hd, kvw = nkv * hd, F = shape_.ff_length(il);
    const AttentionShape as{n_seq_, n_ctx_, nh, nkv, hd, float(1.0 / std::sqrt(double(hd)))};
    if (hidden_fn_) add_hidden_grad(il);
    // x_out = x_mid + act W_down^T (+ b_down) (dx_ holds d x_out)
    if (!frozen && l.b_down != LayerOffsets::kAbsent) bias_backward(N, E, dx_.data(), g + l.b_down);
    linear_backward(F, E, a.act.data(), lin(l.w_down), dx_.data(), dact_.data(), false, gw(l.w_down));
    lora_backward(il, int(LoraKind::Down), a.act.data(), dx_.data(), dact_.data(), gl);
    if (act_l1_ > 0.0f) {
      // The L1 penalty act_l1 * mean_i |act_ti| per token and layer (set_activation_l1).
      const float c = act_l1_ * scale / float(F);
      float* d = dact_.data();
      const float* act = a.act.data();
      for (int64_t i = 0; i < N * F; ++i) d[i] += act[i] > 0.0f ? c : act[i] < 0.0f ? -c : 0.0f;
    }
    if (shape_.ffn_relu)
      reglu_backward<float>(pool_, N * F, a.gate.data(), a.up.data(), a.gate_sig.data(), dact_.data(), dgate_.data(),
                            dup_.data());
    else
      swiglu_backward<float>(pool_, N * F, a.gate.data(), a.up.data(), a.gate_sig.data(), dact_.data(), dgate_.data(),
                             dup_.data());
    linear_backward(E, F, a.h2.data(), lin(l.w_gate), dgate_.data(), dh_.data(), false, gw(l.w_gate));
    linear_backward(E, F, a.h2.data(), lin(l.w_up), dup_.data(), dh_.data(), true, gw(l.w_up));
    lora_backward(il, int(LoraKind::Gate), a.h2.data(), dgate_.data(), dh_.data(), gl);
    lora_backward(il, int(LoraKind::Up), a.h2.data(), dup_.data(), dh_.data(), gl);
    rmsnorm_backward<float>(pool_, N, E, a.x_mid.data(), P + l.ffn_norm, a.rstd2.data(), dh_.data(), dx_.data(),
                            gn(l.ffn_norm), true);
    // x_mid = x + o W_o^T (+ b_o) (dx_ holds d x_mid)
    if (!frozen && l.bo != LayerOffsets::kAbsent) bias_backward(N, E, dx_.data(), g + l.bo);
    linear_backward(qw, E, a.o.data(), lin(l.wo), dx_.data(), do_.data(), false, gw(l.wo));
    lora_backward(il, int(LoraKind::O), a.o.data(), dx_.data(), do_.data(), gl);
    attention_backward(pool_, as, a.q.data(), a.k.data(), a.v.data(), a.o.data(), a.lse.data(), do_.data(), dq_.data(),
                       dk_.data(), dv_.data());
    if (attn_fn_) add_attention_grad(il);
    rope_rotate<float>(pool_, N, n_ctx_, nh, hd, shape_.rope_freq_base, dq_.data(), true);
    rope_rotate<float>(pool_, N, n_ctx_, nkv, hd, shape_.rope_freq_base, dk_.data(), true);
    linear_backward(E, qw, a.h1.data(), lin(l.wq), dq_.data(), dh_.data(), false, gw(l.wq));
    linear_backward(E, kvw, a.h1.data(), lin(l.wk), dk_.data(), dh_.data(), true, gw(l.wk));
    linear_backward(E, kvw, a.h1.data(), lin(l.wv), dv_.data(), dh_.data(), true, gw(l.wv));
    lora_backward(il, int(LoraKind::Q), a.h1.data(), dq_.data(), dh_.data(), gl);
    lora_backward(il, int(LoraKind::K), a.h1.data(), dk_.data(), dh_.data(), gl);
    lora_backward(il, int(LoraKind::V), a.h1.data(), dv_.data(), dh_.data(), gl);
    if (il == 0 && !wanted(m.tok_embd)) break;  // d x of layer 0 only feeds the embedding's gradient
    rmsnorm_backward<float>(pool_, N, E, a.x.data(), P + l.attn_norm, a.rstd1.data(), dh_.data(), dx_.data(),
                            gn(l.attn_norm), true);
  }
  if (wanted(m.tok_embd)) embedding_backward<float>(pool_, N, E, V, inputs_.data(), dx_.data(), g + m.tok_embd);
  return loss_sum / double(n_mean);
}

double ForwardBackward::flops_per_batch() const {
  const double E = double(shape_.n_embd), hd = double(shape_.head_dim()), V = double(shape_.n_vocab);
  const double T = double(n_ctx_);
  double mac_per_token = E * V, attn_mac_per_seq = 0.0;
  for (int64_t il = 0; il < shape_.n_layer; ++il) {
    const double qw = double(shape_.q_width(il)), kvw = double(shape_.kv_width(il)), F = double(shape_.ff_length(il));
    mac_per_token += E * (qw + 2 * kvw) + qw * E + 3 * E * F;
    // Attention: q.k and p.v forward, four products backward (not counting the recompute), over
    // the causal half.
    attn_mac_per_seq += double(shape_.head_count(il)) * hd * T * (T + 1) / 2.0 * 6.0;
  }
  if (lora_ != nullptr) {
    // Frozen base: forward and input gradient (2 products, not 3); each adapter: its two
    // products forward, and dA, dB, du, dx backward.
    double lora_mac_per_token = 0.0;
    for (const LoraSlot& sl : lora_->slots) lora_mac_per_token += double(lora_->rank) * double(sl.n_in + sl.n_out);
    return 2.0 * ((2.0 * mac_per_token + 3.0 * lora_mac_per_token) * double(n_tok_) + attn_mac_per_seq * double(n_seq_));
  }
  if (!trained_.empty())  // the forward and the input gradient, plus dW of the trained matrices
    return 2.0 * ((2.0 * mac_per_token + trained_mac_per_token_) * double(n_tok_) + attn_mac_per_seq * double(n_seq_));
  return 2.0 * (3.0 * mac_per_token * double(n_tok_) + attn_mac_per_seq * double(n_seq_));
}

}  // namespace tern::train
