#include "compress/quantize.h"

#include <fnmatch.h>

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

// The types `tern quantize --type` writes: ggml's, so that llama.cpp loads the result.
constexpr DType kQuantizeTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                                    DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                                    DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4,
                                    DType::TQ1_0, DType::TQ2_0,
                                    // 2:4 magnitude pruning of a dense model (quant/quant_sparse.h)
                                    DType::TS24_Q8, DType::TS24_F16};

bool available(DType t) {
  const QuantTraits* q = quant_traits(t);
  return q && q->from_float;
}

// Layer index of "blk.N.*", -1 otherwise.
int layer_of(const std::string& name) { return int(tensor_layer_index(name)); }

// llama.cpp's "use more bits" layer pattern of the _M mixes: the first and last eighth of the
// layers, and every third layer in between.
bool use_more_bits(int il, int n_layer) {
  return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

int QuantizeReport::n_fallbacks() const {
  int n = 0;
  for (const auto& t : tensors) n += t.type != t.requested;
  return n;
}

std::string quantize_type_names() {
  std::string s;
  for (DType t : kQuantizeTypes)
    if (available(t)) s += std::string(s.empty() ? "" : ", ") + dtype_name(t);
  return s;
}

DType parse_quantize_type(const std::string& name) {
  const auto t = dtype_from_name(name);
  bool ok = false;
  if (t)
    for (DType k : kQuantizeTypes) ok |= k == *t && available(k);
  if (!ok) fail("unknown type '", name, "' (known: ", quantize_type_names(), ")");
  return *t;
}

std::pair<DType, std::string> default_tensor_type(const GgufFile& src, const GgufTensorInfo& t,
                                                  const QuantizeOptions& opts) {
  const int n_layer = int(src.get_uint(src.get_string("general.architecture", "llama") + ".block_count", 0));
  return default_tensor_type(t.name, t.ne, src.find_tensor("output.weight") != nullptr, n_layer, opts);
}

std::pair<DType, std::string> default_tensor_type(const std::string& name, const std::vector<int64_t>& ne,
                                                  bool has_output, int n_layer, const QuantizeOptions& opts) {
  if (opts.pure || dtype_is_float(opts.type)) return {opts.type, "default"};
  if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
    if (opts.output_type) return {*opts.output_type, "--output-type"};
    if (opts.type == DType::Q8_0) return {DType::Q8_0, "output rule (q8_0 target: q8_0)"};
    if (opts.type == DType::MXFP4) return {DType::Q8_0, "output rule (mxfp4 target: q8_0)"};
    if (!available(DType::Q6_K)) return {DType::Q8_0, "output rule (q8_0: no q6_k codec)"};
    if (ne[0] % kQK_K != 0)
      return {DType::Q8_0, str_cat("output rule (q8_0: rows of ", ne[0], " do not fit q6_k's 256-blocks)")};
    return {DType::Q6_K, "output rule (q6_k)"};
  }
  if (name == "token_embd.weight" && opts.embd_type) return {*opts.embd_type, "--embedding-type"};
  // llama-quantize's TQ1_0 / TQ2_0: an untied token embedding in q4_k (a lookup table, not a
  // ternary-trained matrix); the output took the rule above (q6_k).
  if (name == "token_embd.weight" && (opts.type == DType::TQ1_0 || opts.type == DType::TQ2_0))
    return {DType::Q4_K, opts.type == DType::TQ1_0 ? "tq1_0 rule (token embedding: q4_k)" : "tq2_0 rule (token embedding: q4_k)"};
  // llama-quantize's MXFP4_MOE: the experts' 3-D tensors in mxfp4 (the format gpt-oss ships them
  // in), every other matrix in q8_0.
  if (opts.type == DType::MXFP4) {
    if (ne.size() >= 3 && ne[2] > 1) return {DType::MXFP4, "mxfp4_moe rule (expert tensor)"};
    return {DType::Q8_0, "mxfp4_moe rule (not an expert tensor: q8_0)"};
  }
  // The _M mixes (llama-quantize's Q4_K_M / Q5_K_M): attn_v and ffn_down of the "more bits"
  // layers in q6_k.
  if ((opts.type == DType::Q4_K || opts.type == DType::Q5_K) && available(DType::Q6_K) &&
      (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight"))) {
    const int il = layer_of(name);
    if (n_layer > 0 && il >= 0 && use_more_bits(il, n_layer))
      return {DType::Q6_K, opts.type == DType::Q4_K ? "q4_k_m mix (q6_k layer)" : "q5_k_m mix (q6_k layer)"};
  }
  return {opts.type, "default"};
}

bool matches_any(const std::string& name, const std::vector<std::string>& globs) {
  for (const auto& g : globs)
    if (g == name || fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

std::vector<float> tensor_to_f32(const GgufTensorInfo& t, ThreadPool& pool) {
  const QuantTraits& q = require_quant_traits(t.type, t.name.c_str());
  const int64_t n_in = t.ne.empty() ? 1 : t.ne[0], n_rows = t.n_rows();
  const int64_t rb = dtype_row_bytes(t.type, n_in);
  std::vector<float> out(static_cast<size_t>(n_in * n_rows));  // [n_rows, n_in]
  pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) q.to_float(t.data + r * rb, out.data() + r * n_in, n_in);
  });
  return out;
}

std::vector<uint8_t> encode_rows(const float* x, int64_t n_in, int64_t n_rows, DType type, ThreadPool& pool) {
  const QuantTraits& q = require_quant_traits(type, "output tensor");
  if (!q.from_float) fail("tern cannot quantize to ", dtype_name(type));
  const int64_t rb = dtype_row_bytes(type, n_in);
  if (rb < 0) fail("rows of ", n_in, " elements do not fit the ", dtype_name(type), " block size");
  std::vector<uint8_t> out(static_cast<size_t>(rb * n_rows));
  pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) q.from_float(x + r * n_in, out.data() + r * rb, n_in);
  });
  return out;
}

void write_model(const GgufFile& src, const std::vector<OutTensor>& tensors,
                 const std::vector<std::pair<std::string, GgufValue>>& set_kv, const std::string& path) {
  GgufWriter w(src.version() >= 2 ? src.version() : 3);
  w.copy_metadata(src);
  for (const auto& [k, v] : set_kv) w.set(k, v);
  for (const auto& t : tensors) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  w.write(path);
}

namespace {

// Matrices that keep their own type whatever the target, as llama-quantize keeps them (and the
// loaders read them so): a name containing `part` keeps it, for `reason`.
struct KeptMatrix {
  const char* part;
  const char* reason;
};
constexpr KeptMatrix kKeptMatrices[] = {
    {"_norm.weight", "norm: kept"},                // 2-D norms (Mamba-2's grouped ssm_norm)
    {"ssm_conv1d", "ssm_conv1d: kept"},            // the state-space conv taps (rows of d_conv)
    {".time_mix_lerp_fused.", "rwkv lerp: kept"},  // RWKV-6's and RWKV-7's token-shift mixes
    {".time_mix_w1.", "rwkv lora: kept"},          // RWKV-7's low-rank decay, a, v and gate
    {".time_mix_w2.", "rwkv lora: kept"},
    {".time_mix_a1.", "rwkv lora: kept"},
    {".time_mix_a2.", "rwkv lora: kept"},
    {".time_mix_v1.", "rwkv lora: kept"},
    {".time_mix_v2.", "rwkv lora: kept"},
    {".time_mix_g1.", "rwkv lora: kept"},
    {".time_mix_g2.", "rwkv lora: kept"},
    {".time_mix_first.", "rwkv first: kept"},      // RWKV-6's bonus u [head_size, n_head]
    {".time_mix_decay_w1.", "rwkv lora: kept"},    // RWKV-6's low-rank decay (its mixes' LoRA:
    {".time_mix_decay_w2.", "rwkv lora: kept"},    //  time_mix_w1 / w2 above, w2 3-D)
    {".ffn_gate_inp.weight", "router: kept"},      // MoE routers: small, and they pick the experts
    {".ffn_gate_inp_shexp.weight", "shared expert gate: kept"},  // its one row [n_embd, 1] (Qwen2-MoE, Qwen3-Next)
};

const char* kept_matrix_reason(const std::string& name) {
  for (const KeptMatrix& k : kKeptMatrices)
    if (name.find(k.part) != std::string::npos) return k.reason;
  return nullptr;
}

// The tensors of `src` requantized by the rules above (borrowing the unchanged ones), with the
// report and the metadata keys the result sets.
QuantizeReport quantize_tensors(const GgufFile& src, const QuantizeOptions& opts, std::vector<OutTensor>& out,
                                std::vector<std::pair<std::string, GgufValue>>& kv) {
  if (!available(opts.type)) fail("tern cannot quantize to ", dtype_name(opts.type));
  for (const auto& o : {opts.output_type, opts.embd_type})
    if (o && !available(*o)) fail("tern cannot quantize to ", dtype_name(*o));
  const std::string& in_path = src.path();
  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());

  QuantizeReport rep;
  out.reserve(src.tensors().size());
  int64_t total = 0, done = 0;
  for (const auto& t : src.tensors()) total += t.n_elements();
  for (const auto& t : src.tensors()) {
    TensorReport r;
    r.name = t.name;
    r.ne = t.ne;
    r.src_type = t.type;
    r.src_bytes = int64_t(t.n_bytes);
    OutTensor o;
    o.name = t.name;
    o.ne = t.ne;
    DType want = t.type;
    if (matches_any(t.name, opts.keep)) {
      r.reason = "kept (--keep)";
    } else if (t.ne.size() < 2 || !ends_with(t.name, "weight")) {
      r.reason = "1-D: kept";
    } else if (const char* kept = kept_matrix_reason(t.name)) {
      r.reason = kept;
    } else {
      auto [type, why] = default_tensor_type(src, t, opts);
      want = type;
      r.reason = why;
    }
    r.requested = want;
    const int64_t n_in = t.ne.empty() ? 1 : t.ne[0];
    const DType type = want == t.type ? want : fit_row_type(want, n_in);
    if (type != want)
      r.reason = str_cat("fallback: rows of ", n_in, " are not a multiple of the ", dtype_name(want),
                         " block size ", dtype_info(want).block_size, ", stored as ", dtype_name(type));
    r.type = type;
    o.type = type;
    if (type == t.type) {
      o.data = t.data;  // unchanged: borrow the mapping
      o.n_bytes = t.n_bytes;
    } else {
      if (!dtype_is_float(t.type) && !dtype_is_float(type) && !opts.allow_requantize)
        fail(in_path, ": tensor ", t.name, " is already ", dtype_name(t.type), "; requantizing it to ",
             dtype_name(type), " compounds the rounding errors (pass --allow-requantize to do it anyway)");
      const std::vector<float> f = tensor_to_f32(t, pool);
      o.own(encode_rows(f.data(), n_in, t.n_rows(), type, pool));
    }
    r.bytes = int64_t(o.n_bytes);
    rep.src_bytes += r.src_bytes;
    rep.bytes += r.bytes;
    rep.tensors.push_back(std::move(r));
    out.push_back(std::move(o));
    done += t.n_elements();
    if (opts.progress) opts.progress(done, total, t.name);
  }
  // The data pointers of owned tensors stay valid: vector moves keep their heap buffers.
  rep.file_type = llama_file_type(opts.type);
  kv = {{"general.file_type", GgufValue::u32(rep.file_type)}};
  if (!dtype_is_float(opts.type)) kv.emplace_back("general.quantization_version", GgufValue::u32(2));
  return rep;
}

}  // namespace

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantizeOptions& opts) {
  // The input stays memory-mapped while the output is written: the same file would be lost.
  check_output_not_input(out_path, {in_path});
  const int64_t t0 = now_ns();
  const GgufFile src = GgufFile::open(in_path);
  std::vector<OutTensor> out;
  std::vector<std::pair<std::string, GgufValue>> kv;
  QuantizeReport rep = quantize_tensors(src, opts, out, kv);
  write_model(src, out, kv, out_path);
  rep.seconds = double(now_ns() - t0) / 1e9;
  return rep;
}

std::vector<uint8_t> quantize_model_image(const GgufFile& src, const QuantizeOptions& opts, QuantizeReport* report) {
  const int64_t t0 = now_ns();
  std::vector<OutTensor> out;
  std::vector<std::pair<std::string, GgufValue>> kv;
  QuantizeReport rep = quantize_tensors(src, opts, out, kv);
  GgufWriter w(src.version() >= 2 ? src.version() : 3);
  w.copy_metadata(src);
  for (const auto& [k, v] : kv) w.set(k, v);
  for (const auto& t : out) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  std::vector<uint8_t> bytes = w.to_bytes();
  rep.seconds = double(now_ns() - t0) / 1e9;
  if (report) *report = std::move(rep);
  return bytes;
}

QuantizeReport store_in_layout(const std::string& pruned, const std::string& recovered, const std::string& out,
                               std::optional<DType> linear_type,
                               const std::vector<std::pair<std::string, GgufValue>>& set_kv, int n_threads) {
  const GgufFile layout = GgufFile::open(pruned);
  const GgufFile rec = GgufFile::open(recovered);
  ThreadPool pool(n_threads > 0 ? n_threads : default_thread_count());
  QuantizeReport rep;
  std::vector<OutTensor> tensors;
  for (const auto& t : layout.tensors()) {
    const GgufTensorInfo* r = rec.find_tensor(t.name);
    if (!r) fail(recovered, ": missing tensor ", t.name, " of ", pruned);
    if (r->ne != t.ne) fail(recovered, ": tensor ", t.name, " changed shape in training");
    const bool linear = t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2;
    const DType want = linear && linear_type ? *linear_type : t.type;
    const DType type = t.ne.size() < 2 ? DType::F32 : fit_row_type(want, t.ne[0]);
    OutTensor o;
    o.name = t.name;
    o.ne = t.ne;
    o.type = type;
    if (type == r->type) {
      o.data = r->data;
      o.n_bytes = r->n_bytes;
    } else {
      const std::vector<float> f = tensor_to_f32(*r, pool);
      o.own(encode_rows(f.data(), t.ne.empty() ? 1 : t.ne[0], r->n_rows(), type, pool));
    }
    TensorReport tr;
    tr.name = t.name;
    tr.ne = t.ne;
    tr.src_type = r->type;
    tr.requested = want;
    tr.type = type;
    tr.reason = type == want ? std::string(linear && linear_type ? "stored as requested" : "kept type")
                             : str_cat("fallback: rows of ", t.ne[0], " do not fit ", dtype_name(want));
    tr.src_bytes = int64_t(r->n_bytes);
    tr.bytes = int64_t(o.n_bytes);
    rep.src_bytes += tr.src_bytes;
    rep.bytes += tr.bytes;
    rep.tensors.push_back(std::move(tr));
    tensors.push_back(std::move(o));
  }
  std::vector<std::pair<std::string, GgufValue>> kv = set_kv;
  if (linear_type) kv.emplace_back("general.file_type", GgufValue::u32(llama_file_type(*linear_type)));
  write_model(layout, tensors, kv, out);
  return rep;
}

}  // namespace tern
