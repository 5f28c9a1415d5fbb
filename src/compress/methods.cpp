#include "compress/methods.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <mutex>

#include "compress/billm.h"
#include "compress/gptq.h"
#include "compress/linalg.h"
#include "compress/lowrank.h"
#include "compress/prune.h"
#include "compress/structured.h"
#include "quant/quant_tern.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "models/model.h"
#include "models/tensor_names.h"

namespace tern {
namespace {

// Billm: BiLLM with the Hessian; BillmRtn: its binarizers without (salient columns by |w|);
// BillmSign: plain sign binarization in the same format (the same bytes).
enum class Kind { Llama, Rtn, Gptq, Awq, LlmInt8, SmoothQuant, Prune, Structured, LowRank, Billm, BillmRtn, BillmSign };

// The pruning algorithms (compress/prune.h), named in methods as "<algo>[-owl]-<pattern>".
enum class PruneAlgo { Magnitude, Wanda, SparseGpt };

struct MethodDef {
  MethodInfo info;
  Kind kind;
  int bits;
  DType llama_type;  // Kind::Llama only
  // Kind::Prune only:
  PruneAlgo algo = PruneAlgo::Magnitude;
  SparsityPattern pattern{};
  bool owl = false;  // per-layer sparsities from outlier shares (OWL)
  std::optional<DType> store_type{};  // "@type": the pruned linears' storage type (Prune, Structured)
};

const std::vector<MethodDef>& defs() {
  static const std::vector<MethodDef> d = {
      {{"f32", "no compression: f32 weights", false, false}, Kind::Llama, 32, DType::F32},
      {{"f16", "f16 weights", false, false}, Kind::Llama, 16, DType::F16},
      {{"bf16", "bf16 weights", false, false}, Kind::Llama, 16, DType::BF16},
      {{"q8_0", "llama.cpp Q8_0: 8-bit blocks of 32, round to nearest", false, false}, Kind::Llama, 8, DType::Q8_0},
      {{"q6_k", "llama.cpp Q6_K: 6-bit k-quant", false, false}, Kind::Llama, 6, DType::Q6_K},
      {{"q5_k", "llama.cpp Q5_K_M mix: 5-bit k-quant", false, false}, Kind::Llama, 5, DType::Q5_K},
      {{"q5_0", "llama.cpp Q5_0: 5-bit blocks of 32, round to nearest", false, false}, Kind::Llama, 5, DType::Q5_0},
      {{"q4_k", "llama.cpp Q4_K_M mix: 4-bit k-quant", false, false}, Kind::Llama, 4, DType::Q4_K},
      {{"q4_0", "llama.cpp Q4_0: 4-bit blocks of 32, round to nearest", false, false}, Kind::Llama, 4, DType::Q4_0},
      {{"q3_k", "llama.cpp Q3_K: 3-bit k-quant", false, false}, Kind::Llama, 3, DType::Q3_K},
      {{"q2_k", "llama.cpp Q2_K: 2-bit k-quant", false, false}, Kind::Llama, 2, DType::Q2_K},
      {{"tq2_0", "llama.cpp TQ2_0: ternary, 2 bits per trit (absmax scale per 256)", false, false}, Kind::Llama, 2, DType::TQ2_0},
      {{"tq1_0", "llama.cpp TQ1_0: ternary, 1.6 bits per trit (absmax scale per 256)", false, false}, Kind::Llama, 2, DType::TQ1_0},
      {{"rtn-int8", "round to nearest, 8-bit groups with zero points (TQ8)", false, false}, Kind::Rtn, 8, DType::F32},
      {{"rtn-int4", "round to nearest, 4-bit groups with zero points (TQ4)", false, false}, Kind::Rtn, 4, DType::F32},
      {{"rtn-int3", "round to nearest, 3-bit groups with zero points (TQ3)", false, false}, Kind::Rtn, 3, DType::F32},
      {{"gptq-int8", "GPTQ: inverse-Hessian error compensation, 8-bit groups (TQ8)", true, true}, Kind::Gptq, 8, DType::F32},
      {{"gptq-int4", "GPTQ: inverse-Hessian error compensation, 4-bit groups (TQ4)", true, true}, Kind::Gptq, 4, DType::F32},
      {{"gptq-int3", "GPTQ: inverse-Hessian error compensation, 3-bit groups (TQ3)", true, true}, Kind::Gptq, 3, DType::F32},
      {{"awq-int4", "AWQ: activation-aware channel scales and clipping, 4-bit groups (TQ4)", true, false}, Kind::Awq, 4, DType::F32},
      {{"awq-int3", "AWQ: activation-aware channel scales and clipping, 3-bit groups (TQ3)", true, false}, Kind::Awq, 3, DType::F32},
      {{"llm.int8", "LLM.int8(): int8 rows x int8 tokens + 16-bit outlier columns (TI8)", true, false}, Kind::LlmInt8, 8, DType::F32},
      {{"smoothquant-w8a8", "SmoothQuant: smoothing folded into norms/linears, int8 W8A8 (TI8)", true, false}, Kind::SmoothQuant, 8, DType::F32},
      // Binarization (1-bit signs; the format's true cost with magnitudes, split bits and the
      // salient list is 2.75 bits per weight at g = 128, 3.25 at g = 64: quant/quant_billm.h).
      {{"billm", "BiLLM: Hessian-salient columns residual-binarized, split search for the rest, GPTQ error compensation (billm_g*)", true, true}, Kind::Billm, 1, DType::F32},
      {{"billm-rtn", "BiLLM's binarizers without calibration: salient columns by |w|, no error compensation (billm_g*)", false, false}, Kind::BillmRtn, 1, DType::F32},
      {{"billm-sign", "plain sign binarization (mean |w| per row and block) in BiLLM's format: billm's bytes", false, false}, Kind::BillmSign, 1, DType::F32},
  };
  return d;
}

constexpr const char* kPruneAlgos[] = {"magnitude", "wanda", "sparsegpt"};

// A pruning method's definition from its name ("wanda-50", "sparsegpt-2:4", "wanda-owl-70"),
// nullptr when the name is not of that form. Definitions live for the process (MethodInfo
// holds its name as a C string).
const MethodDef* prune_def_base(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, MethodDef> made;
  static std::map<std::string, std::string> names;  // node-stable storage of the names
  // Low-rank: "svd-70", "asvd-70" (the fraction of the linears' parameters kept).
  for (const char* sp : {"svd-", "asvd-"}) {
    const std::string prefix = sp;
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const SparsityPattern p = parse_sparsity(name.substr(prefix.size()));
    if (p.nm()) fail("method '", name, "': a low-rank budget is a percentage of the parameters kept (svd-70)");
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = made.find(name); it != made.end()) return &it->second;
    const std::string& stored = names.emplace(name, name).first->second;
    const bool asvd = prefix == "asvd-";
    MethodDef d{{stored.c_str(),
                 asvd ? "ASVD: activation-whitened truncated SVD of every linear, two factors, for a parameter budget"
                      : "truncated SVD of every linear, two factors, for a parameter budget",
                 asvd, false},
                Kind::LowRank, 16, DType::F32};
    d.pattern = p;  // .sparsity holds the budget kept
    return &made.emplace(name, d).first->second;
  }
  // Structured: "flap-20", "structured-magnitude-20" (a fraction of the layers' parameters).
  for (const char* sp : {"flap-", "structured-magnitude-", "llm-pruner-"}) {
    const std::string prefix = sp;
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const SparsityPattern p = parse_sparsity(name.substr(prefix.size()));
    if (p.nm()) fail("method '", name, "': structured pruning removes a fraction of the parameters, not N:M");
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = made.find(name); it != made.end()) return &it->second;
    const std::string& stored = names.emplace(name, name).first->second;
    const bool flap = prefix == "flap-";
    const char* summary =
        flap ? "FLaP: heads and FFN channels of low fluctuation removed, bias compensation; smaller dense model"
        : prefix == "llm-pruner-"
            ? "LLM-Pruner: heads and FFN channels of low first-order (gradient) importance removed; smaller dense model"
            : "structured magnitude: heads and FFN channels of small weight norm removed; smaller dense model";
    MethodDef d{{stored.c_str(), summary, flap, false}, Kind::Structured, 16, DType::F32};
    d.pattern = p;
    return &made.emplace(name, d).first->second;
  }
  int algo = -1;
  std::string rest;
  for (int a = 0; a < 3; ++a) {
    const std::string prefix = std::string(kPruneAlgos[a]) + "-";
    if (name.rfind(prefix, 0) == 0) {
      algo = a;
      rest = name.substr(prefix.size());
    }
  }
  if (algo < 0 || rest.empty()) return nullptr;
  const bool owl = rest.rfind("owl-", 0) == 0;
  if (owl) rest = rest.substr(4);
  const SparsityPattern p = parse_sparsity(rest);  // throws with the reason
  if (owl && p.nm()) fail("method '", name, "': OWL chooses per-layer sparsities, which N:M patterns fix; drop -owl");
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = made.find(name); it != made.end()) return &it->second;
  const std::string& stored = names.emplace(name, name).first->second;
  static const char* const kSummary[] = {
      "magnitude pruning: the smallest |W| of each matrix removed",
      "Wanda: |W| x input-activation norm, lowest of each output row removed",
      "SparseGPT: OBS updates with the calibration Hessian compensate the removed weights"};
  // OWL weighs magnitudes by activation norms, so magnitude-owl calibrates too.
  MethodDef d{{stored.c_str(), kSummary[algo], algo != 0 || owl, algo == 2}, Kind::Prune, 16, DType::F32};
  d.algo = PruneAlgo(algo);
  d.pattern = p;
  d.owl = owl;
  return &made.emplace(name, d).first->second;
}

const MethodDef* prune_def(const std::string& full_name) {
  static std::mutex mu;
  static std::map<std::string, MethodDef> made;
  static std::map<std::string, std::string> names;  // node-stable storage of the names
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = made.find(full_name); it != made.end()) return &it->second;
  }
  // "<method>@<type>": the pruned weights stored in that type ("wanda-2:4@ts24_q8").
  const size_t at = full_name.find('@');
  const std::string name = full_name.substr(0, at);
  std::optional<DType> store;
  if (at != std::string::npos) store = parse_quantize_type(full_name.substr(at + 1));
  const MethodDef* d = prune_def_base(name);
  if (!d) return nullptr;
  if (at == std::string::npos) return d;
  MethodDef copy = *d;
  copy.store_type = store;
  std::lock_guard<std::mutex> lock(mu);
  const std::string& stored = names.emplace(full_name, full_name).first->second;
  copy.info.name = stored.c_str();
  return &made.emplace(full_name, copy).first->second;
}

const MethodDef& def_of(const std::string& name) {
  const std::string n = name == "smoothquant" ? "smoothquant-w8a8" : name;
  for (const auto& d : defs())
    if (n == d.info.name) return d;
  if (const MethodDef* d = prune_def(n)) return *d;
  std::string known;
  for (const auto& d : defs()) known += std::string(known.empty() ? "" : ", ") + d.info.name;
  fail("unknown method '", name, "' (known: ", known,
       ", and pruning: magnitude|wanda|sparsegpt[-owl]-<sparsity> such as wanda-50, sparsegpt-2:4; structured: "
       "flap-<percent>, llm-pruner-<percent>, structured-magnitude-<percent>; low-rank: svd-<percent kept>, "
       "asvd-<percent kept>)");
}

// ||X_j||_2 per input channel over the calibration tokens (Wanda's activation factor).
std::vector<double> input_norms(const SiteStats& st) {
  std::vector<double> n(static_cast<size_t>(st.n_in));
  for (int64_t j = 0; j < st.n_in; ++j) n[size_t(j)] = std::sqrt(st.sum_sq[size_t(j)]);
  return n;
}

// Names of one layer's tensors.
struct LayerNames {
  std::string attn_norm, q, k, v, o, ffn_norm, gate, up, down;
  explicit LayerNames(int64_t il)
      : attn_norm(tensor_name(Tensor::AttnNorm, il)), q(tensor_name(Tensor::AttnQ, il)),
        k(tensor_name(Tensor::AttnK, il)), v(tensor_name(Tensor::AttnV, il)), o(tensor_name(Tensor::AttnOutput, il)),
        ffn_norm(tensor_name(Tensor::FfnNorm, il)), gate(tensor_name(Tensor::FfnGate, il)),
        up(tensor_name(Tensor::FfnUp, il)), down(tensor_name(Tensor::FfnDown, il)) {}
  std::vector<std::string> linears() const { return {q, k, v, o, gate, up, down}; }
};

// A matrix (or vector) in f32, as the methods edit it.
struct FloatTensor {
  std::vector<float> data;
  int64_t n_in = 0, n_out = 1;
  bool modified = false;
  float* row(int64_t r) { return data.data() + r * n_in; }
};

// The model as the edits so far left it (edited tensors in f32), for sequential calibration.
std::shared_ptr<const GgufFile> edited_model(const GgufFile& src, const std::map<std::string, FloatTensor>& f) {
  GgufWriter w(src.version() >= 2 ? src.version() : 3);
  w.copy_metadata(src);
  for (const auto& t : src.tensors()) {
    const auto it = f.find(t.name);
    if (it != f.end() && it->second.modified)
      w.add_tensor(t.name, DType::F32, t.ne, reinterpret_cast<const uint8_t*>(it->second.data.data()),
                   it->second.data.size() * sizeof(float));
    else
      w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  }
  auto image = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  return std::make_shared<const GgufFile>(
      GgufFile::parse(image, image->data(), image->size(), str_cat(src.path(), " (pruned so far)")));
}

// One input site of a layer: the linears that read it, what precedes it (a norm vector or the
// rows of a linear) and its channel ties.
struct Site {
  std::vector<std::string> weights;
  std::string prev;           // tensor the 1/s folds into
  bool prev_is_norm = true;   // norm: prev[j] /= s_j; linear: rows prev[row(j)] /= s_j
  std::vector<int32_t> tie;   // class per channel (empty: none); for a linear prev, class = its row
};

std::vector<Site> layer_sites(const LayerNames& n, const HParams& hp) {
  // attn_output's input channel c = h * head_dim + d comes from V row (h / group) * head_dim + d;
  // heads of one group read one V head, so their channels share a scale (and that row).
  std::vector<int32_t> tie(static_cast<size_t>(hp.n_embd));
  const int64_t group = hp.n_head / hp.n_head_kv;
  for (int64_t h = 0; h < hp.n_head; ++h)
    for (int64_t d = 0; d < hp.head_dim; ++d) tie[size_t(h * hp.head_dim + d)] = int32_t((h / group) * hp.head_dim + d);
  std::vector<int32_t> none;
  return {
      {{n.q, n.k, n.v}, n.attn_norm, true, none},
      {{n.o}, n.v, false, tie},
      {{n.gate, n.up}, n.ffn_norm, true, none},
      {{n.down}, n.up, false, none},
  };
}

// Folds per-channel scales into a site: W[:, j] *= s_j for its linears, 1/s_j into prev.
void fold_scales(std::map<std::string, FloatTensor>& f, const Site& site, const std::vector<float>& s) {
  for (const auto& name : site.weights) {
    FloatTensor& w = f.at(name);
    for (int64_t o = 0; o < w.n_out; ++o) {
      float* r = w.row(o);
      for (int64_t j = 0; j < w.n_in; ++j) r[j] *= s[size_t(j)];
    }
    w.modified = true;
  }
  FloatTensor& p = f.at(site.prev);
  const int64_t n = int64_t(s.size());
  if (site.prev_is_norm) {
    for (int64_t j = 0; j < n; ++j) p.data[size_t(j)] /= s[size_t(j)];
  } else {
    // Row of prev feeding channel j: the tie class (GQA) or j itself. Tied channels share s, so
    // each row is divided once.
    std::vector<bool> done(size_t(p.n_out), false);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = site.tie.empty() ? j : site.tie[size_t(j)];
      if (done[size_t(r)]) continue;
      done[size_t(r)] = true;
      float* row = p.row(r);
      for (int64_t i = 0; i < p.n_in; ++i) row[i] /= s[size_t(j)];
    }
  }
  p.modified = true;
}

// Group size for rows of n_in: the requested one when it divides the rows (or the row length when
// smaller), else 64 when that divides them; otherwise the requested size with a short last group
// (the algorithms run, but no tern type stores it: the tensor falls back).
int64_t group_for(int64_t n_in, int64_t requested) {
  if (n_in <= requested) return n_in;
  if (n_in % requested == 0) return requested;
  if (n_in % 64 == 0) return 64;
  return requested;
}

// An encoded output tensor.
struct Encoded {
  DType type;
  DType requested;
  std::vector<uint8_t> bytes;
  std::string reason;
};

Encoded encode_fallback(const FloatTensor& w, DType requested, const std::string& why, ThreadPool& pool) {
  const DType t = fit_row_type(DType::F16, w.n_in);
  return {t, requested, encode_rows(w.data.data(), w.n_in, w.n_out, t, pool),
          str_cat("fallback: ", why, ", stored as ", dtype_name(t))};
}

Encoded encode_group(const GroupQuant& gq, const FloatTensor& w, const char* method, ThreadPool& pool) {
  const auto type = group_quant_type(gq.bits, gq.group, gq.n_in);
  const DType want = tq_type(gq.bits, gq.group == 64 ? 64 : 128).value_or(DType::F16);
  if (!type)
    return encode_fallback(w, want,
                           str_cat("rows of ", w.n_in, " do not split into tq groups of 64 or 128"), pool);
  return {*type, *type, pack_group_quant(gq), method};
}

Encoded encode_ti8(const FloatTensor& w, const std::vector<int32_t>& cols, const char* method, ThreadPool& pool) {
  const auto type = ti8_type_for(w.n_in, int64_t(cols.size()));
  if (!type)
    return encode_fallback(w, DType::TI8, str_cat("rows of ", w.n_in, " are not a multiple of 32"), pool);
  const int64_t rb = dtype_row_bytes(*type, w.n_in);
  std::vector<uint8_t> out(static_cast<size_t>(rb * w.n_out));
  pool.parallel_for(w.n_out, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o)
      ti8_pack_row(*type, w.data.data() + o * w.n_in, w.n_in, cols.data(), int64_t(cols.size()), out.data() + o * rb);
  });
  return {*type, *type, std::move(out),
          cols.empty() ? std::string(method) : str_cat(method, ", ", cols.size(), " outlier columns in 16 bits")};
}

// A binarized linear (Kind::Billm*) in BILLM_G64/G128: BiLLM with the calibration Hessian, its
// binarizers alone, or plain signs; rows that split into neither block size fall back.
Encoded encode_billm(Kind kind, const FloatTensor& w, int64_t group, const SiteStats* st, double damp, LayerReport& lr,
                     int64_t* salient, const char* method, ThreadPool& pool) {
  const std::optional<DType> type = w.n_in % group == 0 ? billm_type(int(group)) : std::nullopt;
  if (!type)
    return encode_fallback(w, DType::BILLM_G128, str_cat("rows of ", w.n_in, " do not split into billm blocks of 64 or 128"),
                           pool);
  const int g = int(group);
  std::vector<uint8_t> bytes;
  if (kind == Kind::BillmSign) {
    bytes = billm_encode_rows_sign(w.data.data(), w.n_out, w.n_in, g, pool);
  } else if (kind == Kind::BillmRtn || !st) {
    bytes = billm_encode_rows_rtn(w.data.data(), w.n_out, w.n_in, g, pool);
  } else {
    BillmOptions bo;
    bo.group = g;
    bo.damp = damp;
    BillmStats bs;
    bytes = billm_quantize(w.data.data(), w.n_out, w.n_in, st->hessian, bo, pool, &bs);
    *salient += bs.salient_columns;
    // The layer-wise output error against the calibration-free encoder of the same format.
    const std::vector<uint8_t> rtn = billm_encode_rows_rtn(w.data.data(), w.n_out, w.n_in, g, pool);
    const BillmFormat f{g};
    const int64_t rb = dtype_row_bytes(*type, w.n_in);
    std::vector<float> deq(w.data.size()), deq_rtn(w.data.size());
    for (int64_t o = 0; o < w.n_out; ++o) {
      billm_decode(f, bytes.data() + o * rb, deq.data() + o * w.n_in, w.n_in);
      billm_decode(f, rtn.data() + o * rb, deq_rtn.data() + o * w.n_in, w.n_in);
    }
    lr.err = output_error_gram(w.data.data(), deq.data(), w.n_out, w.n_in, st->hessian, pool) / double(st->n_tokens);
    lr.err_rtn = output_error_gram(w.data.data(), deq_rtn.data(), w.n_out, w.n_in, st->hessian, pool) / double(st->n_tokens);
  }
  return {*type, *type, std::move(bytes), method};
}

// The per-tensor report of a method that wrote OUT itself (low-rank, structured), read back from
// the files: a tensor IN lacks is `new_reason`, one whose shape changed "reshaped".
void fill_written_report(MethodReport& rep, const std::string& in_path, const std::string& out_path,
                         const char* new_reason, int64_t t0) {
  const GgufFile src = GgufFile::open(in_path), out = GgufFile::open(out_path);
  for (const auto& t : out.tensors()) {
    TensorReport r;
    r.name = t.name;
    r.ne = t.ne;
    const GgufTensorInfo* s = src.find_tensor(t.name);
    r.src_type = s ? s->type : t.type;
    r.requested = r.type = t.type;
    r.src_bytes = s ? int64_t(s->n_bytes) : 0;
    r.bytes = int64_t(t.n_bytes);
    r.reason = !s ? new_reason : s->ne != t.ne ? "reshaped (structures removed)" : "kept";
    rep.quant.bytes += r.bytes;
    rep.quant.tensors.push_back(std::move(r));
  }
  for (const auto& t : src.tensors()) rep.quant.src_bytes += int64_t(t.n_bytes);
  rep.quant.file_type = uint32_t(out.get_uint("general.file_type", 0));
  rep.seconds = double(now_ns() - t0) / 1e9;
  rep.quant.seconds = rep.seconds;
}

// Low-rank factorization (lowrank.h) as a method: relative allocation (each matrix's own
// spectrum; docs/lowrank.md measured it ahead of raw energy), factors in "@type" or the source's.
MethodReport apply_lowrank(const MethodDef& m, const std::string& in_path, const std::string& out_path,
                           const MethodOptions& opts, int64_t t0) {
  LowRankOptions lo;
  lo.method = m.info.needs_calib ? LowRankMethod::Asvd : LowRankMethod::Svd;
  lo.budget = m.pattern.sparsity;
  lo.relative = true;
  lo.type = m.store_type;
  lo.damp = opts.damp;
  lo.n_threads = opts.n_threads;
  lo.progress = opts.progress;
  if (lo.method == LowRankMethod::Asvd) {
    if (!opts.sequential || opts.sequential->text_file.empty())
      fail(m.info.name, " needs calibration data (--calib FILE)");
    lo.calib = *opts.sequential;
  }
  const LowRankReport lr = lowrank_model(in_path, out_path, lo);
  MethodReport rep;
  rep.method = m.info.name;
  rep.notes.push_back(str_cat("linear parameters ", lr.params_before, " -> ", lr.params_after));
  fill_written_report(rep, in_path, out_path, "low-rank factor", t0);
  return rep;
}

// Structured pruning (structured.h) as a method: its report in the methods' terms, the file's
// tensors read back for the per-tensor table.
MethodReport apply_structured(const MethodDef& m, const std::string& in_path, const std::string& out_path,
                              const CalibStats* calib, const MethodOptions& opts, int64_t t0) {
  const std::string name = m.info.name;
  const bool flap = name.rfind("flap-", 0) == 0, llm_pruner = name.rfind("llm-pruner-", 0) == 0;
  StructuredOptions so;
  // --speed-only: the calibration-free baseline cuts the same fraction (same size and speed class).
  so.method = !opts.search ? "magnitude" : flap ? "flap" : llm_pruner ? "llm-pruner" : "magnitude";
  std::vector<LayerScores> gradient;
  if (so.method == "llm-pruner") {
    if (!opts.gradient_scores)
      fail(name, " needs the training engine's gradients: run it through tern prune, quantize or compare");
    gradient = opts.gradient_scores(in_path);
    so.scores = &gradient;
  }
  so.ratio = m.pattern.sparsity;
  so.ratio_of = opts.structured_ratio_of;
  so.ffn_multiple = opts.structured_ffn_multiple > 0 ? opts.structured_ffn_multiple : ffn_multiple_for(m.store_type);
  so.n_threads = opts.n_threads;
  so.progress = opts.progress;
  if (so.method == "flap" && !calib) fail(m.info.name, " needs calibration data (--calib FILE)");
  // With "@type" the smaller model is written in the source's types first, then stored as asked.
  const std::string struct_out = m.store_type ? make_scratch_file(out_path, "structured") : out_path;
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } cleanup{m.store_type ? struct_out : std::string()};
  const StructuredReport sr = structured_prune(in_path, struct_out, so.method == "flap" ? calib : nullptr, so);
  if (m.store_type) store_in_layout(struct_out, struct_out, out_path, m.store_type, {}, opts.n_threads);
  MethodReport rep;
  rep.method = m.info.name;
  rep.notes = sr.notes;
  if ((flap || llm_pruner) && !opts.search)
    rep.notes.push_back("--speed-only: structured magnitude pruning at the same ratio");
  fill_written_report(rep, in_path, out_path, "added (bias compensation)", t0);
  return rep;
}

}  // namespace

const std::vector<MethodInfo>& compression_methods() {
  static const std::vector<MethodInfo> infos = [] {
    std::vector<MethodInfo> v;
    for (const auto& d : defs()) v.push_back(d.info);
    return v;
  }();
  return infos;
}

const MethodInfo& find_method(const std::string& name) { return def_of(name).info; }

bool is_pruning_method(const std::string& name) {
  const Kind k = def_of(name).kind;
  return k == Kind::Prune || k == Kind::Structured;
}

std::vector<std::string> default_compare_methods(DType src_type) {
  const std::string src = src_type == DType::F16 ? "f16" : src_type == DType::BF16 ? "bf16" : "f32";
  return {src, "q8_0", "q4_0", "q4_k", "gptq-int4", "awq-int4", "llm.int8", "smoothquant-w8a8"};
}

void check_method_source(const std::string& method, const GgufFile& src) {
  const MethodDef& m = def_of(method);
  if (m.kind == Kind::Structured) {
    check_structured_source(src);
    return;
  }
  if (m.kind == Kind::LowRank) {
    for (const auto& t : src.tensors())
      if (t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2 && !dtype_is_float(t.type))
        fail(src.path(), " is already quantized (", t.name, " is ", dtype_name(t.type), "): ", m.info.name,
             " starts from float weights; dequantize with tern quantize ", src.path(), " OUT.gguf --type f16 first");
    return;
  }
  for (const auto& t : src.tensors())
    if (t.ne.size() == 2 && !dtype_is_float(t.type) && !(m.kind == Kind::Llama && t.type == m.llama_type) &&
        // Pruning leaves the embeddings and the output as they are, in whatever type.
        !(m.kind == Kind::Prune && t.name.rfind("blk.", 0) != 0))
      fail(src.path(), " is already quantized (", t.name, " is ", dtype_name(t.type), "): ", m.info.name,
           " starts from float weights (f32, f16 or bf16); give it the original model",
           m.kind == Kind::Prune ? str_cat(" (prune the float model, then quantize, or store the pruned weights "
                                           "quantized with --type; with only this file, dequantize it first: tern "
                                           "quantize ", src.path(), " OUT.gguf --type f16)")
                                 : std::string());
}

MethodReport apply_method(const std::string& method, const std::string& in_path, const std::string& out_path,
                          const CalibStats* calib, const MethodOptions& opts) {
  const MethodDef& m = def_of(method);
  const int64_t t0 = now_ns();
  MethodReport rep;
  rep.method = m.info.name;
  check_output_not_input(out_path, {in_path});
  auto file = std::make_shared<const GgufFile>(GgufFile::open(in_path));
  const GgufFile& src = *file;
  check_method_source(method, src);

  if (m.kind == Kind::Llama) {
    QuantizeOptions qo;
    qo.type = m.llama_type;
    qo.n_threads = opts.n_threads;
    qo.progress = opts.progress;
    rep.quant = quantize_model(in_path, out_path, qo);
    rep.seconds = double(now_ns() - t0) / 1e9;
    return rep;
  }

  if (m.kind == Kind::Structured) return apply_structured(m, in_path, out_path, calib, opts, t0);
  if (m.kind == Kind::LowRank) return apply_lowrank(m, in_path, out_path, opts, t0);

  const bool search = opts.search;
  const bool uses_calib = (m.info.needs_calib && search) || m.kind == Kind::LlmInt8;
  if (uses_calib && !calib) fail(m.info.name, " needs calibration data (--calib FILE)");
  if (m.info.needs_hessian && search && calib && !calib->sites.empty() && calib->sites[0].hessian.empty())
    fail(m.info.name, " needs the calibration Hessian (calibrate with hessian = true)");
  if (opts.group <= 0) fail("--group must be positive");
  if (m.kind == Kind::SmoothQuant && !(opts.alpha >= 0 && opts.alpha <= 1)) fail("--alpha must be in [0, 1]");

  const HParams hp = read_hparams(src);
  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());

  // f32 copies of what the method reads or edits: every layer's linears and norms.
  std::map<std::string, FloatTensor> f;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerNames n(il);
    for (const auto& name : {n.attn_norm, n.q, n.k, n.v, n.o, n.ffn_norm, n.gate, n.up, n.down}) {
      const GgufTensorInfo* t = src.find_tensor(name);
      if (!t) fail(in_path, ": missing tensor ", name);
      FloatTensor ft;
      ft.data = tensor_to_f32(*t, pool);
      ft.n_in = t->ne[0];
      ft.n_out = t->n_rows();
      f.emplace(name, std::move(ft));
    }
  }

  // Pruning: each layer's sparsity (OWL's per-layer ratios, else the pattern's).
  std::vector<double> layer_sparsity(size_t(hp.n_layer), m.pattern.fraction());
  if (m.kind == Kind::Prune) {
    if (m.owl) {
      std::vector<double> lod(size_t(hp.n_layer), 0.0);
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        double outliers = 0, total = 0;
        for (const auto& name : LayerNames(il).linears()) {
          const FloatTensor& w = f.at(name);
          const std::vector<double> xn = uses_calib ? input_norms(calib->of(name)) : std::vector<double>(size_t(w.n_in), 1.0);
          const double n = double(w.n_out * w.n_in);
          outliers += wanda_outlier_share(w.data.data(), w.n_out, w.n_in, xn, opts.owl_m) * n;
          total += n;
        }
        lod[size_t(il)] = outliers / total;
      }
      layer_sparsity = owl_layer_sparsity(lod, m.pattern.sparsity, opts.owl_lambda);
      std::string list;
      for (double v : layer_sparsity) list += str_cat(list.empty() ? "" : " ", std::lround(v * 1000) / 10.0);
      rep.notes.push_back(str_cat("OWL layer sparsities (%): ", list));
    }
  }

  std::map<std::string, Encoded> enc;  // linear weight -> encoded
  const char* tag = m.info.name;
  int64_t total_outliers = 0;
  int64_t total_salient = 0;  // BiLLM: salient columns over every block of every linear
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerNames n(il);
    const std::vector<Site> sites = layer_sites(n, hp);
    switch (m.kind) {
      case Kind::Rtn:
      case Kind::Gptq: {
        for (const auto& name : n.linears()) {
          FloatTensor& w = f.at(name);
          const int64_t g = group_for(w.n_in, opts.group);
          LayerReport lr;
          lr.name = name;
          GroupQuant gq;
          if (m.kind == Kind::Gptq && search) {
            const SiteStats& st = calib->of(name);
            GptqOptions go;
            go.bits = m.bits;
            go.group = g;
            go.damp = opts.damp;
            go.act_order = opts.act_order;
            GptqStats gs;
            gq = gptq_quantize(w.data.data(), w.n_out, w.n_in, st.hessian, go, pool, &gs);
            const GroupQuant rtn = rtn_group_quant(w.data.data(), w.n_out, w.n_in, m.bits, g, pool);
            lr.err = output_error_gram(w.data.data(), gq.dequantize().data(), w.n_out, w.n_in, st.hessian, pool) /
                     double(st.n_tokens);
            lr.err_rtn = output_error_gram(w.data.data(), rtn.dequantize().data(), w.n_out, w.n_in, st.hessian, pool) /
                         double(st.n_tokens);
          } else {
            gq = rtn_group_quant(w.data.data(), w.n_out, w.n_in, m.bits, g, pool);
          }
          enc.emplace(name, encode_group(gq, w, tag, pool));
          rep.layers.push_back(lr);
        }
        break;
      }
      case Kind::Awq: {
        // Phase 1: search every site on the float weights and fold the scales; phase 2 quantizes,
        // so that a fold into a previous linear (attn_v, ffn_up rows) lands before its rounding.
        std::map<std::string, std::vector<float>> site_scale;  // weight -> s of its site
        std::map<std::string, double> site_alpha;
        for (const Site& s : sites) {
          const SiteStats* st = search ? &calib->of(s.weights[0]) : nullptr;
          std::vector<float> scale(size_t(f.at(s.weights[0]).n_in), 1.0f);
          double alpha = 0;
          if (search) {
            std::vector<const float*> ws;
            std::vector<int64_t> outs;
            for (const auto& name : s.weights) {
              ws.push_back(f.at(name).data.data());
              outs.push_back(f.at(name).n_out);
            }
            AwqOptions ao = opts.awq;
            ao.bits = m.bits;
            ao.group = group_for(f.at(s.weights[0]).n_in, opts.group);
            // The MLP's scales are judged at its output (llm-awq), with ffn_down in f32.
            const bool mlp = s.weights.size() == 2 && s.weights[1] == n.up && opts.awq.mlp_objective;
            const FloatTensor& down = f.at(n.down);
            const AwqScales sc = awq_search(ws, outs, f.at(s.weights[0]).n_in, *st, s.tie, ao, pool,
                                            mlp ? down.data.data() : nullptr, down.n_out);
            scale = sc.s;
            alpha = sc.alpha;
            fold_scales(f, s, scale);
          }
          for (const auto& name : s.weights) {
            site_scale[name] = scale;
            site_alpha[name] = alpha;
          }
        }
        for (const Site& s : sites)
          for (const auto& name : s.weights) {
            FloatTensor& w = f.at(name);
            AwqOptions ao = opts.awq;
            ao.bits = m.bits;
            ao.group = group_for(w.n_in, opts.group);
            LayerReport lr;
            lr.name = name;
            GroupQuant gq;
            if (search) {
              const SiteStats& st = calib->of(name);
              const std::vector<float>& sc = site_scale[name];
              // Activations as the scaled layer sees them: x / s.
              const int64_t n_t = std::min(st.n_samples, ao.clip_tokens);
              std::vector<float> xs(static_cast<size_t>(n_t * w.n_in));
              for (int64_t t = 0; t < n_t; ++t)
                for (int64_t j = 0; j < w.n_in; ++j)
                  xs[size_t(t * w.n_in + j)] = st.samples[size_t(t * w.n_in + j)] / sc[size_t(j)];
              // llm-awq leaves attn_q/attn_k unclipped: their error passes through softmax.
              const bool clip = name != n.q && name != n.k;
              gq = awq_quantize(w.data.data(), w.n_out, w.n_in, xs.data(), n_t, clip, ao, pool);
              std::vector<float> deq = gq.dequantize();
              for (int64_t o = 0; o < w.n_out; ++o)
                for (int64_t j = 0; j < w.n_in; ++j) deq[size_t(o * w.n_in + j)] /= sc[size_t(j)];
              // The error report compares with the weights as the layer now computes them (other
              // sites' folds included): W' / s, and with RTN of those same weights.
              std::vector<float> w0 = w.data;
              for (int64_t o = 0; o < w.n_out; ++o)
                for (int64_t j = 0; j < w.n_in; ++j) w0[size_t(o * w.n_in + j)] /= sc[size_t(j)];
              const GroupQuant rtn = rtn_group_quant(w0.data(), w.n_out, w.n_in, m.bits, ao.group, pool);
              lr.err = output_error_samples(w0.data(), deq.data(), w.n_out, w.n_in, st.samples.data(), st.n_samples, pool) /
                       double(st.n_samples);
              lr.err_rtn = output_error_samples(w0.data(), rtn.dequantize().data(), w.n_out, w.n_in, st.samples.data(),
                                                st.n_samples, pool) /
                           double(st.n_samples);
              lr.alpha = site_alpha[name];
            } else {
              gq = rtn_group_quant(w.data.data(), w.n_out, w.n_in, m.bits, ao.group, pool);
            }
            enc.emplace(name, encode_group(gq, w, tag, pool));
            rep.layers.push_back(lr);
          }
        break;
      }
      case Kind::LlmInt8: {
        for (const Site& s : sites) {
          const SiteStats& st = calib->of(s.weights[0]);
          std::vector<int32_t> cols;
          for (int64_t j = 0; j < st.n_in; ++j)
            if (double(st.absmax[size_t(j)]) > opts.threshold) cols.push_back(int32_t(j));
          for (const auto& name : s.weights) {
            enc.emplace(name, encode_ti8(f.at(name), cols, tag, pool));
            LayerReport lr;
            lr.name = name;
            lr.outliers = int64_t(cols.size());
            rep.layers.push_back(lr);
            if (enc.at(name).type != enc.at(name).requested) continue;
            total_outliers += int64_t(cols.size());
          }
        }
        break;
      }
      case Kind::SmoothQuant: {
        if (search) {
          for (const Site& s : sites) {
            const SiteStats& st = calib->of(s.weights[0]);
            const int64_t n_in = st.n_in;
            // s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), max over tied channels too.
            std::vector<double> xmax(static_cast<size_t>(n_in)), wmax(size_t(n_in), 0.0);
            for (int64_t j = 0; j < n_in; ++j) xmax[size_t(j)] = st.absmax[size_t(j)];
            for (const auto& name : s.weights) {
              FloatTensor& w = f.at(name);
              for (int64_t o = 0; o < w.n_out; ++o)
                for (int64_t j = 0; j < n_in; ++j)
                  wmax[size_t(j)] = std::max(wmax[size_t(j)], double(std::fabs(w.row(o)[j])));
            }
            if (!s.tie.empty()) {
              std::map<int32_t, std::pair<double, double>> cls;
              for (int64_t j = 0; j < n_in; ++j) {
                auto& c = cls[s.tie[size_t(j)]];
                c.first = std::max(c.first, xmax[size_t(j)]);
                c.second = std::max(c.second, wmax[size_t(j)]);
              }
              for (int64_t j = 0; j < n_in; ++j) {
                xmax[size_t(j)] = cls[s.tie[size_t(j)]].first;
                wmax[size_t(j)] = cls[s.tie[size_t(j)]].second;
              }
            }
            std::vector<float> sc(size_t(n_in), 1.0f);
            for (int64_t j = 0; j < n_in; ++j)
              if (xmax[size_t(j)] > 0 && wmax[size_t(j)] > 0)
                sc[size_t(j)] = float(std::clamp(std::pow(xmax[size_t(j)], opts.alpha) /
                                                     std::pow(wmax[size_t(j)], 1.0 - opts.alpha),
                                                 1e-5, 1e5));
            fold_scales(f, s, sc);
          }
        }
        for (const auto& name : n.linears()) {
          enc.emplace(name, encode_ti8(f.at(name), {}, tag, pool));
          LayerReport lr;
          lr.name = name;
          rep.layers.push_back(lr);
        }
        break;
      }
      case Kind::Prune: {
        const SparsityPattern& pat = m.pattern;
        const PruneAlgo algo = search ? m.algo : PruneAlgo::Magnitude;
        // Sequential: this layer's inputs as the pruned layers before it produce them.
        CalibStats layer_calib;
        const CalibStats* lc = calib;
        if (uses_calib && opts.sequential && il > 0) {
          CalibOptions co = *opts.sequential;
          co.hessian = m.info.needs_hessian;
          co.progress = nullptr;
          co.n_threads = opts.n_threads;
          layer_calib = calibrate(edited_model(src, f), co);
          lc = &layer_calib;
        }
        for (const auto& name : n.linears()) {
          FloatTensor& w = f.at(name);
          check_pattern(pat, w.n_in, str_cat(in_path, ": ", name));
          SparsityPattern p = pat;
          if (!pat.nm()) p.sparsity = layer_sparsity[size_t(il)];
          const std::vector<float> w0 = w.data;
          const SiteStats* st = uses_calib ? &lc->of(name) : nullptr;
          switch (algo) {
            case PruneAlgo::Magnitude: prune_magnitude(w.data.data(), w.n_out, w.n_in, p, pool); break;
            case PruneAlgo::Wanda: prune_wanda(w.data.data(), w.n_out, w.n_in, input_norms(*st), p, pool); break;
            case PruneAlgo::SparseGpt: {
              SparseGptOptions so;
              so.damp = opts.damp;
              // At least 4 mask blocks per row: one block over a short row fixes every column's
              // sparsity up front, which loses the adaptivity the block-wise choice gives.
              so.block = std::min(opts.sparsegpt_block, std::max<int64_t>(8, (w.n_in + 3) / 4));
              prune_sparsegpt(w.data.data(), w.n_out, w.n_in, st->hessian, p, so, pool);
              break;
            }
          }
          w.modified = true;
          LayerReport lr;
          lr.name = name;
          lr.sparsity = zero_fraction(w.data.data(), int64_t(w.data.size()));
          if (st && !st->hessian.empty())
            lr.err = output_error_gram(w0.data(), w.data.data(), w.n_out, w.n_in, st->hessian, pool) / double(st->n_tokens);
          else if (st && st->n_samples > 0)
            lr.err = output_error_samples(w0.data(), w.data.data(), w.n_out, w.n_in, st->samples.data(), st->n_samples,
                                          pool) /
                     double(st->n_samples);
          const GgufTensorInfo* t = src.find_tensor(name);
          const DType want = m.store_type ? *m.store_type : opts.prune_type.value_or(t->type);
          const DType type = fit_row_type(want, w.n_in);
          enc.emplace(name, Encoded{type, want, encode_rows(w.data.data(), w.n_in, w.n_out, type, pool),
                                    type == want ? str_cat(tag, ", ", pat.nm() ? pat.name() : p.name(), " zeros")
                                                 : str_cat("fallback: rows of ", w.n_in, " do not fit ",
                                                           dtype_name(want), ", stored as ", dtype_name(type))});
          rep.layers.push_back(lr);
        }
        break;
      }
      case Kind::Billm:
      case Kind::BillmRtn:
      case Kind::BillmSign: {
        for (const auto& name : n.linears()) {
          const FloatTensor& w = f.at(name);
          LayerReport lr;
          lr.name = name;
          const SiteStats* st = m.kind == Kind::Billm && search ? &calib->of(name) : nullptr;
          enc.emplace(name, encode_billm(m.kind, w, group_for(w.n_in, opts.group), st, opts.damp, lr, &total_salient,
                                         tag, pool));
          rep.layers.push_back(lr);
        }
        break;
      }
      case Kind::Llama:
      case Kind::Structured:
      case Kind::LowRank: break;  // returned above
    }
    if (opts.progress) opts.progress(il + 1, hp.n_layer, str_cat(tag, " layer ", il));
  }

  // Assemble the file in the source's tensor order.
  QuantizeOptions rule;
  rule.type = m.bits >= 8 ? DType::Q8_0 : DType::Q4_0;
  std::vector<OutTensor> out;
  std::map<DType, int64_t> linear_bytes;
  for (const auto& t : src.tensors()) {
    TensorReport r;
    r.name = t.name;
    r.ne = t.ne;
    r.src_type = t.type;
    r.src_bytes = int64_t(t.n_bytes);
    OutTensor o;
    o.name = t.name;
    o.ne = t.ne;
    if (auto it = enc.find(t.name); it != enc.end()) {
      o.type = it->second.type;
      o.own(std::move(it->second.bytes));
      r.requested = it->second.requested;
      r.reason = it->second.reason;
      linear_bytes[o.type] += int64_t(o.n_bytes);
    } else if (auto ft = f.find(t.name); ft != f.end() && ft->second.modified && t.ne.size() == 1) {
      // A norm with scales folded in: f32, as the loader requires.
      o.type = DType::F32;
      const auto* p = reinterpret_cast<const uint8_t*>(ft->second.data.data());
      o.own(std::vector<uint8_t>(p, p + ft->second.data.size() * sizeof(float)));
      r.requested = DType::F32;
      r.reason = "norm with smoothing scales folded in";
    } else if (t.ne.size() < 2 || m.kind == Kind::Prune) {
      // Pruning leaves the embeddings, the output and the norms as they are.
      o.type = t.type;
      o.data = t.data;
      o.n_bytes = t.n_bytes;
      r.requested = t.type;
      r.reason = t.ne.size() < 2 ? "1-D: kept" : "not pruned: kept";
    } else {
      auto [want, why] = default_tensor_type(src, t, rule);
      const DType type = fit_row_type(want, t.ne[0]);
      r.requested = want;
      r.reason = type == want ? str_cat(why, " of ", dtype_name(rule.type))
                              : str_cat("fallback: rows of ", t.ne[0], " do not fit ", dtype_name(want), ", stored as ",
                                        dtype_name(type));
      o.type = type;
      if (type == t.type) {
        o.data = t.data;
        o.n_bytes = t.n_bytes;
      } else {
        const std::vector<float> x = tensor_to_f32(t, pool);
        o.own(encode_rows(x.data(), t.ne[0], t.n_rows(), type, pool));
      }
    }
    r.type = o.type;
    r.bytes = int64_t(o.n_bytes);
    rep.quant.src_bytes += r.src_bytes;
    rep.quant.bytes += r.bytes;
    rep.quant.tensors.push_back(std::move(r));
    out.push_back(std::move(o));
  }

  DType main_type = DType::F16;
  int64_t most = -1;
  for (const auto& [t, b] : linear_bytes)
    if (b > most && (!dtype_is_float(t) || m.kind == Kind::Prune)) {
      most = b;
      main_type = t;
    }
  rep.quant.file_type = llama_file_type(main_type);
  std::vector<std::pair<std::string, GgufValue>> kv = {{"general.file_type", GgufValue::u32(rep.quant.file_type)}};
  if (!dtype_is_float(main_type)) kv.emplace_back("general.quantization_version", GgufValue::u32(2));
  if (m.kind == Kind::Prune) {
    double zeros = 0, total = 0;
    for (const auto& l : rep.layers) {
      const FloatTensor& w = f.at(l.name);
      zeros += l.sparsity * double(w.data.size());
      total += double(w.data.size());
    }
    kv.emplace_back("tern.prune.method", GgufValue::string(m.info.name));
    kv.emplace_back("tern.prune.pattern", GgufValue::string(m.pattern.nm() ? m.pattern.name() : "unstructured"));
    kv.emplace_back("tern.prune.sparsity", GgufValue::f32(float(total > 0 ? zeros / total : 0)));
    kv.emplace_back("tern.prune.search", GgufValue::boolean(search));
  } else {
    kv.emplace_back("tern.quant.method", GgufValue::string(m.info.name));
    kv.emplace_back("tern.quant.bits", GgufValue::u32(uint32_t(m.bits)));
    kv.emplace_back("tern.quant.search", GgufValue::boolean(search));
  }
  if (uses_calib) kv.emplace_back("tern.quant.calib_tokens", GgufValue::u32(uint32_t(calib->n_tokens)));
  switch (m.kind) {
    case Kind::Rtn:
    case Kind::Gptq:
    case Kind::Awq:
    case Kind::Billm:
    case Kind::BillmRtn:
    case Kind::BillmSign: kv.emplace_back("tern.quant.group_size", GgufValue::u32(uint32_t(opts.group))); break;
    default: break;
  }
  if (m.kind == Kind::Gptq) {
    kv.emplace_back("tern.quant.gptq.damp", GgufValue::f32(float(opts.damp)));
    kv.emplace_back("tern.quant.gptq.act_order", GgufValue::boolean(opts.act_order));
  }
  if (m.kind == Kind::LlmInt8) {
    kv.emplace_back("tern.quant.llm_int8.threshold", GgufValue::f32(float(opts.threshold)));
    kv.emplace_back("tern.quant.llm_int8.outlier_columns", GgufValue::u32(uint32_t(total_outliers)));
  }
  if (m.kind == Kind::SmoothQuant) kv.emplace_back("tern.quant.smoothquant.alpha", GgufValue::f32(float(opts.alpha)));
  if (m.kind == Kind::Billm && search) {
    kv.emplace_back("tern.quant.billm.damp", GgufValue::f32(float(opts.damp)));
    kv.emplace_back("tern.quant.billm.salient_columns", GgufValue::u32(uint32_t(total_salient)));
    rep.notes.push_back(str_cat("salient columns (residual-binarized), summed over the blocks: ", total_salient));
  }
  write_model(src, out, kv, out_path);

  if (!search && m.kind == Kind::Prune && m.algo != PruneAlgo::Magnitude)
    rep.notes.push_back("--speed-only: magnitude pruning at the method's pattern (same zeros per row, size and speed)");
  else if (!search && m.kind != Kind::Rtn && m.kind != Kind::LlmInt8 && m.kind != Kind::Prune &&
           m.kind != Kind::BillmRtn && m.kind != Kind::BillmSign)
    rep.notes.push_back("--speed-only: round-to-nearest values in the method's format (same size and speed)");
  rep.seconds = double(now_ns() - t0) / 1e9;
  rep.quant.seconds = rep.seconds;
  return rep;
}

}  // namespace tern
