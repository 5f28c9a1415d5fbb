// Llama-family decoder (Llama 2/3, TinyLlama, Mistral-style GQA): RMSNorm, RoPE ("normal"
// pair layout), grouped-query attention, SwiGLU FFN, tied or untied output.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <memory>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "core/huge_buffer.h"
#include "core/path_chooser.h"
#include "models/model.h"
#include "models/registry.h"
#include "models/weight_check.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

struct LayerNames {
  std::string wq, wk, wv, wo, w_gate, w_up, w_down;
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  WeightView wq, wk, wv, wo;         // [n_embd -> n_embd | n_embd_kv]
  WeightView w_gate, w_up, w_down;   // [n_embd -> n_ff], [n_ff -> n_embd]
};

// TERN_SMALL_MODEL_PATH=phased|serial forces the small-model path (tests, benchmarks); unset
// or anything else: chosen by timing.
int small_path_from_env() {
  const char* v = std::getenv("TERN_SMALL_MODEL_PATH");
  if (!v) return -1;
  const std::string s = v;
  return s == "phased" ? 1 : s == "serial" ? 0 : -1;
}

// The single-region forward path (forward_spmd) applies up to this size.
constexpr int64_t kSpmdMaxTokens = 8;
constexpr int64_t kSpmdMaxEmbd = 1024;

class LlamaModel final : public Model {
 public:
  explicit LlamaModel(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    hp_ = read_hparams(*file_);
    const int64_t E = hp_.n_embd, Ekv = hp_.n_embd_kv(), F = hp_.n_ff, V = hp_.n_vocab;
    reserve_interleaved(E, Ekv, F, V);
    tok_embd_ = weight("token_embd.weight", E, V);
    output_norm_ = norm("output_norm.weight", E);
    if (file_->find_tensor("output.weight")) {
      output_ = matmul_weight("output.weight", E, V);
    } else {
      output_ = tok_embd_;  // tied embeddings
      output_is_tied_ = true;
    }
    layers_.resize(size_t(hp_.n_layer));
    names_.resize(size_t(hp_.n_layer));
    for (int64_t il = 0; il < hp_.n_layer; ++il) {
      const std::string b = "blk." + std::to_string(il) + ".";
      LayerWeights& L = layers_[size_t(il)];
      names_[size_t(il)] = {b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight", b + "attn_output.weight",
                            b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_down.weight"};
      L.attn_norm = norm(b + "attn_norm.weight", E);
      L.wq = matmul_weight(b + "attn_q.weight", E, E);
      L.wk = matmul_weight(b + "attn_k.weight", E, Ekv);
      L.wv = matmul_weight(b + "attn_v.weight", E, Ekv);
      L.wo = matmul_weight(b + "attn_output.weight", E, E);
      L.ffn_norm = norm(b + "ffn_norm.weight", E);
      L.w_gate = matmul_weight(b + "ffn_gate.weight", E, F);
      L.w_up = matmul_weight(b + "ffn_up.weight", E, F);
      L.w_down = matmul_weight(b + "ffn_down.weight", F, E);
    }
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    const auto stream = [&](const WeightView& w) {
      decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(w.data), size_t(w.n_out * w.row_bytes()));
    };
    for (const LayerWeights& L : layers_)
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) stream(*w);
    stream(output_);
  }

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const auto T = size_t(n_tokens);
    x_.assign(T * size_t(hp_.n_embd), 0.0f);
    xn_.assign(T * size_t(hp_.n_embd), 0.0f);
    q_.assign(T * size_t(hp_.n_embd), 0.0f);
    k_.assign(T * size_t(hp_.n_embd_kv()), 0.0f);
    v_.assign(T * size_t(hp_.n_embd_kv()), 0.0f);
    attn_.assign(T * size_t(hp_.n_embd), 0.0f);
    gate_.assign(T * size_t(hp_.n_ff), 0.0f);
    up_.assign(T * size_t(hp_.n_ff), 0.0f);
    positions_.assign(T, 0);
    rope_cs_.assign(T * size_t(hp_.n_rot), 0.0f);
    out_rows_.assign(T * size_t(hp_.n_embd), 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits,
               ThreadPool& pool) override;

 private:
  void forward_layers_pooled(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool);
  void forward_spmd(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits, ThreadPool& pool);
  // Final norm and output projection of the rows that need logits (after forward_layers_pooled).
  void forward_output(std::span<const SeqBatch> seqs, float* logits, ThreadPool& pool);
  void forward_small_serial(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits);
  int64_t gather_output_rows(std::span<const SeqBatch> seqs, float* out) const;
  // matmul_shared_input epilogues (ctx = this): RoPE on finished q (target 0) / k (target 1)
  // rows, SwiGLU on finished gate/up rows.
  static void rope_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1);
  static void swiglu_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1);

 public:

 private:
  WeightView weight(const std::string& name, int64_t n_in, int64_t n_out) const {
    const GgufTensorInfo* t = file_->find_tensor(name);
    if (!t) fail(file_->path(), ": missing tensor ", name);
    require_quant_traits(t->type, name.c_str());
    if (t->ne.size() != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
      fail(file_->path(), ": loading ", name, ": expected ", n_in, " x ", n_out, ", file has ",
           t->shape_string());
    check_weights_finite(file_->path(), *t);
    return WeightView{t->type, n_in, n_out, t->data};
  }
  // A matmul weight as the kernels read it fastest: Q4_0 / Q8_0 interleaved by 16 rows for
  // the AVX2 / AVX-512 kernels (kernels/matmul.h; TERN_REPACK=0 keeps the rows as stored). The copy
  // replaces the file's bytes, whose pages are handed back to the kernel (they are a read-only
  // mapping: nothing is lost, a later reader gets them from the file again), so resident
  // memory stays one copy of the weights.
  WeightView matmul_weight(const std::string& name, int64_t n_in, int64_t n_out) {
    WeightView w = weight(name, n_in, n_out);
    if (!want_interleave16(w)) return w;
    const size_t bytes = size_t(w.n_out * w.row_bytes());
    uint8_t* dst;
    if (arena_used_ + bytes <= arena_bytes_) {
      dst = arena_.get() + arena_used_;
      arena_used_ += (bytes + 63) / 64 * 64;
    } else {  // not planned by reserve_interleaved (cannot happen for the names it lists)
      interleaved_.push_back(alloc_huge_buffer(bytes));
      dst = interleaved_.back().get();
    }
    interleave16(w, dst);
    if (file_->file_mapped()) {
      const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
      const uintptr_t b = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page;
      const uintptr_t e = (reinterpret_cast<uintptr_t>(w.data) + bytes) / page * page;
      if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
    }
    w.data = dst;
    w.interleaved16 = true;
    return w;
  }
  // One buffer for all of matmul_weight's interleaved copies (2 MiB-aligned, on 2 MiB pages with
  // TERN_HUGEPAGES=1). One buffer per tensor, each rounded up to whole 2 MiB pages (a huge page
  // is resident whole once touched), made TinyLlama Q4_0's peak RSS 911 MB instead of 627.
  // Tensors that are missing or malformed are left to matmul_weight's errors. (Splitting the
  // copies over threads, tried: load times 0.7-2.1 vs 0.9-1.8 s, no gain on this VM, where the
  // first writes' page faults dominate.)
  void reserve_interleaved(int64_t E, int64_t Ekv, int64_t F, int64_t V) {
    size_t total = 0;
    const auto plan = [&](const std::string& name, int64_t n_in, int64_t n_out) {
      const GgufTensorInfo* t = file_->find_tensor(name);
      if (!t || !quant_traits(t->type) || t->ne.size() != 2 || t->ne[0] != n_in || t->ne[1] != n_out) return;
      const WeightView w{t->type, n_in, n_out, t->data};
      if (want_interleave16(w)) total += size_t(w.n_out * w.row_bytes() + 63) / 64 * 64;
    };
    plan("output.weight", E, V);
    for (int64_t il = 0; il < hp_.n_layer; ++il) {
      const std::string b = "blk." + std::to_string(il) + ".";
      for (const char* n : {"attn_q.weight", "attn_output.weight"}) plan(b + n, E, E);
      for (const char* n : {"attn_k.weight", "attn_v.weight"}) plan(b + n, E, Ekv);
      for (const char* n : {"ffn_gate.weight", "ffn_up.weight"}) plan(b + n, E, F);
      plan(b + "ffn_down.weight", F, E);
    }
    if (total == 0) return;
    arena_ = alloc_huge_buffer(total);
    arena_bytes_ = total;
  }
  const float* norm(const std::string& name, int64_t n) const {
    const GgufTensorInfo* t = file_->find_tensor(name);
    if (!t) fail(file_->path(), ": missing tensor ", name);
    if (t->type != DType::F32)
      fail(file_->path(), ": loading ", name, ": norm weights must be f32, file has ", dtype_name(t->type));
    if (t->ne.size() != 1 || t->ne[0] != n)
      fail(file_->path(), ": loading ", name, ": expected ", n, ", file has ", t->shape_string());
    if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
      fail(file_->path(), ": tensor ", name, " data is misaligned");
    check_weights_finite(file_->path(), *t);
    return reinterpret_cast<const float*>(t->data);
  }

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;                     // matmul_weight's interleaved copies, one after another
  size_t arena_bytes_ = 0, arena_used_ = 0;
  std::vector<HugeBuffer> interleaved_;  // any the arena did not plan for
  WeightView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  bool output_is_tied_ = false;
  std::vector<LayerWeights> layers_;
  std::vector<LayerNames> names_;

  int64_t max_tokens_ = 0;
  // Activation scratch, sized by reserve(); T = tokens of the step.
  std::vector<float> x_;      // [T, n_embd] residual stream
  std::vector<float> xn_;     // [T, n_embd] normalised input of a block
  std::vector<float> q_;      // [T, n_head * head_dim]
  std::vector<float> k_;      // [T, n_head_kv * head_dim]
  std::vector<float> v_;      // [T, n_head_kv * head_dim]
  std::vector<float> attn_;   // [T, n_embd] attention output before wo
  std::vector<float> gate_;   // [T, n_ff]
  std::vector<float> up_;     // [T, n_ff]
  std::vector<int32_t> positions_;  // [T]
  std::vector<float> rope_cs_;      // [T][n_rot / 2][2] RoPE cos/sin per token (rope_table)
  std::vector<float> out_rows_;     // [rows needing logits, n_embd]
  std::vector<AttentionArgs> attn_args_;
  PhasedWork spmd_work_;               // forward_spmd's phases
  PathChooser spmd_chooser_;           // forward_spmd (1) or this thread alone (0), by timing
  PathChooser batch_chooser_;          // small models' larger steps: pooled (1) or alone (0)
  int small_path_forced_ = small_path_from_env();  // -1: choose by timing
  ThreadPool serial_{1};               // no threads: runs on the caller
  std::vector<int32_t> phase_units_;   // units per phase of the current pass
};

void LlamaModel::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits,
                         ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  int64_t T = 0;
  for (const auto& s : seqs) {
    TERN_ASSERT(int64_t(s.slots.size()) >= s.n_past + int64_t(s.tokens.size()));
    T += int64_t(s.tokens.size());
  }
  if (T == 0) return;
  TERN_ASSERT_MSG(T <= max_tokens_, "step larger than reserve()");

  // Embedding lookup and positions.
  {
    int64_t t = 0;
    for (const auto& s : seqs)
      for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
        const int32_t id = s.tokens[i];
        TERN_ASSERT_MSG(id >= 0 && id < V, "token id out of range");
        dequantize_row(tok_embd_, id, x_.data() + t * E);
        positions_[size_t(t)] = int32_t(s.n_past + int64_t(i));
      }
    // The rotations depend on the position only: tabulated once, not per head and layer.
    rope_table(positions_.data(), T, hp_.n_rot, hp_.rope_freq_base, rope_cs_.data());
  }

  // Small models decoding a few tokens: each operation is a microsecond or less, so one pool
  // region per operation (11 per layer) costs more than the work. They run either as one region
  // for the whole pass in phases (forward_spmd) or on this thread alone; which is faster depends
  // on how fast the cores hand work to each other (on a VM: where the host puts the vCPUs), so
  // both are timed and the faster is used (PathChooser; TERN_SMALL_MODEL_PATH=phased|serial
  // forces one). Bigger steps and models keep the pooled path, whose work-claiming chunks
  // tolerate a descheduled thread. All three give the same bits.
  // The step's size for the choosers: the positions it attends to (a long context's attention
  // pays for the threads' hand-offs where a short one's does not).
  int64_t attended = 0;
  for (const auto& s : seqs) attended += s.n_past + int64_t(s.tokens.size());
  if (pool.size() > 1 && !observer_ && T <= kSpmdMaxTokens && E <= kSpmdMaxEmbd) {
    const int path = small_path_forced_ >= 0 ? small_path_forced_ : spmd_chooser_.pick(attended);
    const auto t0 = std::chrono::steady_clock::now();
    if (path == 1) {
      forward_spmd(seqs, kv, T, logits, pool);
      spmd_chooser_.record(1, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(T));
      return;
    }
    forward_small_serial(seqs, kv, T, logits);
    spmd_chooser_.record(0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(T));
    return;
  }
  // Their larger steps (prefill): the pooled path, or this thread alone when that is faster (a
  // 32-token stories260K prefill measured 12-80k tok/s pooled on 2 threads against ~75k alone,
  // depending on the host's vCPU placement); timed the same way (1 = pooled, 0 = alone).
  if (pool.size() > 1 && !observer_ && E <= kSpmdMaxEmbd) {
    const int path = small_path_forced_ >= 0 ? small_path_forced_ : batch_chooser_.pick(attended);
    const auto t0 = std::chrono::steady_clock::now();
    if (path == 0) {
      forward_small_serial(seqs, kv, T, logits);
      batch_chooser_.record(0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(T));
      return;
    }
    forward_layers_pooled(seqs, kv, T, pool);
    forward_output(seqs, logits, pool);
    batch_chooser_.record(1, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(T));
    return;
  }
  forward_layers_pooled(seqs, kv, T, pool);
  forward_output(seqs, logits, pool);
}

void LlamaModel::forward_output(std::span<const SeqBatch> seqs, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;

  // Final norm and output projection only for the rows that need logits.
  const int64_t rows = gather_output_rows(seqs, out_rows_.data());
  rms_norm(out_rows_.data(), output_norm_, out_rows_.data(), rows, E, hp_.rms_eps, pool);
  if (observer_) observer_->on_linear_input(output_is_tied_ ? "token_embd.weight" : "output.weight", out_rows_.data(), rows, E);
  matmul(output_, out_rows_.data(), E, rows, logits, V, pool);
}

void LlamaModel::rope_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1) {
  auto* m = static_cast<LlamaModel*>(const_cast<void*>(ctx));
  const HParams& hp = m->hp_;
  if (target == 0)
    rope_cols_table(m->q_.data(), hp.n_embd, m->rope_cs_.data(), n_tokens, hp.head_dim, hp.n_rot, r0, r1);
  else if (target == 1)
    rope_cols_table(m->k_.data(), hp.n_embd_kv(), m->rope_cs_.data(), n_tokens, hp.head_dim, hp.n_rot, r0, r1);
}

void LlamaModel::swiglu_rows_done(const void* ctx, int, int64_t n_tokens, int64_t r0, int64_t r1) {
  auto* m = static_cast<LlamaModel*>(const_cast<void*>(ctx));
  swiglu_cols(m->gate_.data(), m->up_.data(), m->gate_.data(), m->hp_.n_ff, n_tokens, r0, r1);
}

void LlamaModel::forward_small_serial(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits) {
  forward_layers_pooled(seqs, kv, T, serial_);
  forward_output(seqs, logits, serial_);
}

int64_t LlamaModel::gather_output_rows(std::span<const SeqBatch> seqs, float* out) const {
  const int64_t E = hp_.n_embd;
  int64_t rows = 0, t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.all_logits) {
      std::copy_n(x_.data() + t * E, n * E, out + rows * E);
      rows += n;
    } else {
      std::copy_n(x_.data() + (t + n - 1) * E, E, out + rows * E);
      rows += 1;
    }
    t += n;
  }
  return rows;
}

void LlamaModel::forward_layers_pooled(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                                       ThreadPool& pool) {
  const int64_t E = hp_.n_embd, Ekv = hp_.n_embd_kv(), F = hp_.n_ff;
  const float scale = 1.0f / std::sqrt(float(hp_.head_dim));
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& L = layers_[size_t(il)];
    const LayerNames& N = names_[size_t(il)];
    // q, k and v from one quantized copy of xn = rms_norm(x) in one pool region: each row is
    // normalised (into xn_) right before it is quantized, and RoPE is applied to each chunk of
    // q/k rows as it is produced. The observer reads xn_ once it is written.
    const MatmulTarget qkv[] = {{L.wq, q_.data(), E}, {L.wk, k_.data(), Ekv}, {L.wv, v_.data(), Ekv}};
    matmul_shared_input(qkv, x_.data(), E, T, pool, RowsDone{rope_rows_done, this, false},
                        InputRmsNorm{L.attn_norm, hp_.rms_eps, xn_.data()});
    if (observer_) {
      observer_->on_linear_input(N.wq, xn_.data(), T, E);
      observer_->on_linear_input(N.wk, xn_.data(), T, E);
      observer_->on_linear_input(N.wv, xn_.data(), T, E);
    }

    // Store the new K/V at their slots (converted to the store's type), then attend per sequence.
    const void* kc = kv.k(il);
    const void* vc = kv.v(il);
    attn_args_.clear();
    int64_t t = 0;
    for (const auto& s : seqs) {
      const int64_t n = int64_t(s.tokens.size());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = s.slots[size_t(s.n_past + i)];
        kv.store(il, slot, 0, k_.data() + (t + i) * Ekv, v_.data() + (t + i) * Ekv, Ekv);
      }
      attn_args_.push_back(AttentionArgs{q_.data() + t * E, E, attn_.data() + t * E, E, kc, vc, Ekv,
                                         s.slots.data(), s.n_past, n, hp_.n_head, hp_.n_head_kv,
                                         hp_.head_dim, scale, kv.type()});
      t += n;
    }
    attention(attn_args_, pool);
    if (observer_) observer_->on_linear_input(N.wo, attn_.data(), T, E);
    matmul(L.wo, attn_.data(), E, T, xn_.data(), E, pool);
    add_inplace(x_.data(), xn_.data(), T * E);

    // gate and up of xn = rms_norm(x) (normalised as it is quantized, as above), chunk by
    // chunk, each chunk's SwiGLU right after (into gate_).
    const MatmulTarget gate_up[] = {{L.w_gate, gate_.data(), F}, {L.w_up, up_.data(), F}};
    matmul_shared_input(gate_up, x_.data(), E, T, pool, RowsDone{swiglu_rows_done, this, true},
                        InputRmsNorm{L.ffn_norm, hp_.rms_eps, xn_.data()});
    if (observer_) {
      observer_->on_linear_input(N.w_gate, xn_.data(), T, E);
      observer_->on_linear_input(N.w_up, xn_.data(), T, E);
    }
    if (observer_) observer_->on_linear_input(N.w_down, gate_.data(), T, F);
    matmul(L.w_down, gate_.data(), F, T, xn_.data(), E, pool);
    add_inplace(x_.data(), xn_.data(), T * E);
  }
}

// One pool region for the whole pass, in phases (PhasedWork: each thread runs its own units and
// steals a late thread's; a phase starts when the previous one is complete). Per layer:
//   A  one unit per KV head: its GQA group's q/k/v rows, RoPE, cache writes and attention
//      (a group needs nothing from the other groups)
//   B  n_embd rows of wo, added into the residual
//   C  n_ff rows of gate and up, and their SwiGLU
//   D  n_embd rows of down, added into the residual
// then the vocab rows of the output. RMSNorm of the (small) residual is recomputed by each
// thread into its own buffer when it first needs it in a phase, instead of one more phase.
// Row units start at multiples of 4, the kernels' row tile, so every output equals the pooled
// path's bit for bit.
void LlamaModel::forward_spmd(std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, float* logits,
                              ThreadPool& pool) {
  const int64_t E = hp_.n_embd, Ekv = hp_.n_embd_kv(), F = hp_.n_ff, V = hp_.n_vocab;
  const int64_t hd = hp_.head_dim, g = hp_.n_head / hp_.n_head_kv;
  const float scale = 1.0f / std::sqrt(float(hd));
  int64_t n_out_rows = 0;
  for (const auto& s : seqs) n_out_rows += s.all_logits ? int64_t(s.tokens.size()) : 1;

  // One unit per thread and phase (rows a multiple of 4; KV heads): each unit costs a few
  // calls' set-up, comparable to its arithmetic at this size (stories260K on 2 threads: two
  // units per thread 48k tok/s, one 51k). A late thread's unit is still taken by the other.
  const int64_t nth = pool.size();
  auto rows_per_unit = [&](int64_t n) { return ((n + nth - 1) / nth + 3) / 4 * 4; };
  const int64_t per_e = rows_per_unit(E), per_f = rows_per_unit(F), per_v = rows_per_unit(V);
  const int64_t per_kvh = (hp_.n_head_kv + nth - 1) / nth;
  auto units = [](int64_t n, int64_t per) { return int32_t((n + per - 1) / per); };
  phase_units_.clear();
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    phase_units_.push_back(units(hp_.n_head_kv, per_kvh));
    phase_units_.push_back(units(E, per_e));
    phase_units_.push_back(units(F, per_f));
    phase_units_.push_back(units(E, per_e));
  }
  phase_units_.push_back(units(V, per_v));
  spmd_work_.reset(phase_units_, pool.size());
  ThreadPool& serial = serial_;  // no threads: the row-wise ops below run on the calling thread

  pool.run([&](int ith, int) {
    thread_local std::vector<float> xn;        // [T, n_embd] this thread's normalised residual
    thread_local std::vector<float> out_rows;  // [n_out_rows, n_embd]
    xn.resize(size_t(T * E));
    int normed_for = -1;  // the phase whose input xn holds
    spmd_work_.run(ith, [&](int phase, int unit) {
      const int64_t il = phase / 4;
      if (il == hp_.n_layer) {  // output projection
        if (normed_for != phase) {
          out_rows.resize(size_t(n_out_rows * E));
          gather_output_rows(seqs, out_rows.data());
          rms_norm(out_rows.data(), output_norm_, out_rows.data(), n_out_rows, E, hp_.rms_eps, serial);
          normed_for = phase;
        }
        const int64_t v0 = unit * per_v;
        matmul_rows(output_, out_rows.data(), E, n_out_rows, logits, V, v0, std::min(V, v0 + per_v));
        return;
      }
      const LayerWeights& L = layers_[size_t(il)];
      switch (phase % 4) {
        case 0: {
          if (normed_for != phase) {
            rms_norm(x_.data(), L.attn_norm, xn.data(), T, E, hp_.rms_eps, serial);
            normed_for = phase;
          }
          // KV heads [h0, h1): their GQA groups' q rows, their k / v rows
          const int64_t h0 = unit * per_kvh, h1 = std::min(hp_.n_head_kv, h0 + per_kvh);
          matmul_rows(L.wq, xn.data(), E, T, q_.data(), E, h0 * g * hd, h1 * g * hd);
          matmul_rows(L.wk, xn.data(), E, T, k_.data(), Ekv, h0 * hd, h1 * hd);
          matmul_rows(L.wv, xn.data(), E, T, v_.data(), Ekv, h0 * hd, h1 * hd);
          rope_cols_table(q_.data(), E, rope_cs_.data(), T, hd, hp_.n_rot, h0 * g * hd, h1 * g * hd);
          rope_cols_table(k_.data(), Ekv, rope_cs_.data(), T, hd, hp_.n_rot, h0 * hd, h1 * hd);
          const void* kc = kv.k(il);
          const void* vc = kv.v(il);
          int64_t t = 0;
          for (const auto& s : seqs) {
            const int64_t n = int64_t(s.tokens.size());
            for (int64_t i = 0; i < n; ++i) {
              const int64_t slot = s.slots[size_t(s.n_past + i)];
              kv.store(il, slot, h0 * hd, k_.data() + (t + i) * Ekv + h0 * hd, v_.data() + (t + i) * Ekv + h0 * hd,
                       (h1 - h0) * hd);
            }
            const AttentionArgs args{q_.data() + t * E, E, attn_.data() + t * E, E, kc, vc, Ekv, s.slots.data(),
                                     s.n_past, n, hp_.n_head, hp_.n_head_kv, hd, scale, kv.type()};
            for (int64_t kvh = h0; kvh < h1; ++kvh) attention_kv_head(args, kvh);
            t += n;
          }
          break;
        }
        case 1:
        case 3: {
          const int64_t e0 = unit * per_e, e1 = std::min(E, e0 + per_e);
          if (phase % 4 == 1) matmul_rows(L.wo, attn_.data(), E, T, xn_.data(), E, e0, e1);
          else matmul_rows(L.w_down, gate_.data(), F, T, xn_.data(), E, e0, e1);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t e = e0; e < e1; ++e) x_[size_t(t * E + e)] += xn_[size_t(t * E + e)];
          break;
        }
        case 2: {
          if (normed_for != phase) {
            rms_norm(x_.data(), L.ffn_norm, xn.data(), T, E, hp_.rms_eps, serial);
            normed_for = phase;
          }
          const int64_t f0 = unit * per_f, f1 = std::min(F, f0 + per_f);
          matmul_rows(L.w_gate, xn.data(), E, T, gate_.data(), F, f0, f1);
          matmul_rows(L.w_up, xn.data(), E, T, up_.data(), F, f0, f1);
          for (int64_t t = 0; t < T; ++t)
            swiglu(gate_.data() + t * F + f0, up_.data() + t * F + f0, gate_.data() + t * F + f0, f1 - f0, serial);
          break;
        }
      }
    });
  });
}

}  // namespace

std::unique_ptr<Model> make_llama(std::shared_ptr<const GgufFile> file) {
  return std::make_unique<LlamaModel>(std::move(file));
}

}  // namespace tern
