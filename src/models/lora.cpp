#include "models/lora.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <map>
#include <random>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

constexpr const char* kSuffixA = ".lora_a";
constexpr const char* kSuffixB = ".lora_b";
constexpr const char* kTokenEmbd = "token_embd.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensor's values as f32, rows after rows (any type tern has a codec for).
std::vector<float> to_f32(const GgufTensorInfo& t, const std::string& path) {
  const QuantTraits& q = require_quant_traits(t.type, t.name.c_str());
  const int64_t n = t.n_elements();
  if (n % q.block_size != 0) fail(path, ": tensor ", t.name, " (", t.shape_string(), ") is not whole blocks of ", q.name);
  std::vector<float> out(size_t(n), 0.0f);
  q.to_float(t.data, out.data(), n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[size_t(i)])) fail(path, ": tensor ", t.name, " has a non-finite value at element ", i);
  return out;
}

std::string shape_of(int64_t ne0, int64_t ne1) { return str_cat(ne0, " x ", ne1); }

// The step kernels' operands, f32 or (half) IEEE half: A as it is, B transposed.
void make_operands(LoraPair& p, bool half) {
  if (p.embedding()) return;
  const int64_t R = p.rank;
  p.half = half;
  std::vector<float> bt(p.b.size());
  for (int64_t o = 0; o < p.n_out; ++o)
    for (int64_t k = 0; k < R; ++k) bt[size_t(k * p.n_out + o)] = p.b[size_t(o * R + k)];
  if (!half) {
    p.bt = std::move(bt);
    return;
  }
  p.a_half.resize(p.a.size());
  p.bt_half.resize(bt.size());
  for (size_t i = 0; i < p.a.size(); ++i) p.a_half[i] = f32_to_fp16(p.a[i]);
  for (size_t i = 0; i < bt.size(); ++i) p.bt_half[i] = f32_to_fp16(bt[i]);
}

}  // namespace

bool LoraPair::embedding() const { return target == kTokenEmbd; }

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const std::string& path) {
  const GgufFile file = GgufFile::open(path);
  return from_file(file);
}

std::shared_ptr<const LoraAdapter> LoraAdapter::from_file(const GgufFile& file) {
  static std::atomic<uint64_t> next_uid{1};
  const std::string& path = file.path();
  auto ad = std::make_shared<LoraAdapter>();
  ad->path_ = path;
  const std::string type = file.get_string("general.type", "");
  if (type != "adapter")
    fail(path, ": not a LoRA adapter (general.type is ",
         type.empty() ? std::string("missing") : "\"" + type + "\"", ", an adapter has \"adapter\")");
  const std::string atype = file.get_string("adapter.type", "");
  if (atype != "lora") fail(path, ": adapter.type is \"", atype, "\"; tern reads LoRA adapters (\"lora\")");
  ad->arch_ = file.get_string("general.architecture", "");
  if (ad->arch_.empty()) fail(path, ": missing general.architecture (the base model's architecture)");
  if (const GgufValue* a = file.find("adapter.lora.alpha")) {
    const double alpha = a->as_float("adapter.lora.alpha");
    if (!std::isfinite(alpha)) fail(path, ": adapter.lora.alpha is not finite (", alpha, ")");
    ad->alpha_ = float(alpha);
  }

  // Pair up A and B by their base tensor's name (file order of the first half seen).
  struct Halves { const GgufTensorInfo* a = nullptr; const GgufTensorInfo* b = nullptr; };
  std::map<std::string, Halves> halves;
  std::vector<std::string> order;
  for (const GgufTensorInfo& t : file.tensors()) {
    const bool is_a = ends_with(t.name, kSuffixA), is_b = ends_with(t.name, kSuffixB);
    if (!is_a && !is_b) {
      if (ends_with(t.name, "_norm.weight")) continue;  // llama.cpp ignores norm vectors too
      fail(path, ": tensor ", t.name, " is neither a .lora_a nor a .lora_b tensor");
    }
    const std::string target = t.name.substr(0, t.name.size() - 7);
    if (t.ne.size() != 2) fail(path, ": tensor ", t.name, " has ", t.ne.size(), " dimensions; LoRA halves have 2");
    auto [it, fresh] = halves.try_emplace(target);
    if (fresh) order.push_back(target);
    (is_a ? it->second.a : it->second.b) = &t;
  }
  if (order.empty()) fail(path, ": the adapter has no .lora_a / .lora_b tensors");
  for (const std::string& target : order) {
    const Halves& h = halves[target];
    if (!h.a || !h.b)
      fail(path, ": tensor ", target, (h.a ? kSuffixB : kSuffixA), " is missing (LoRA tensors come in pairs)");
    LoraPair p;
    p.target = target;
    if (p.embedding()) {
      // A: ne [rank, n_vocab], B: ne [rank, n_embd].
      p.rank = h.a->ne[0];
      p.n_out = h.a->ne[1];
      p.n_in = h.b->ne[1];
      if (h.b->ne[0] != p.rank)
        fail(path, ": ", target, kSuffixA, " (", h.a->shape_string(), ") and ", target, kSuffixB, " (",
             h.b->shape_string(), ") disagree on the rank");
    } else {
      // A: ne [n_in, rank], B: ne [rank, n_out].
      p.n_in = h.a->ne[0];
      p.rank = h.a->ne[1];
      p.n_out = h.b->ne[1];
      if (h.b->ne[0] != p.rank)
        fail(path, ": ", target, kSuffixA, " (", h.a->shape_string(), ") and ", target, kSuffixB, " (",
             h.b->shape_string(), ") disagree on the rank (A must be n_in x rank, B rank x n_out)");
    }
    if (p.rank <= 0 || p.n_in <= 0 || p.n_out <= 0)
      fail(path, ": ", target, " has rank ", p.rank, " (", h.a->shape_string(), "); a LoRA rank is at least 1");
    p.a = to_f32(*h.a, path);
    p.b = to_f32(*h.b, path);
    // F16 halves keep their precision (the values convert back exactly).
    make_operands(p, h.a->type == DType::F16 && h.b->type == DType::F16);
    ad->pairs_.push_back(std::move(p));
  }
  ad->uid_ = next_uid.fetch_add(1);
  return ad;
}

std::shared_ptr<const LoraAdapter> LoraAdapter::from_pairs(const std::string& name, const std::string& architecture,
                                                           float alpha, std::vector<LoraPair> pairs, bool half) {
  static std::atomic<uint64_t> next_uid{1ull << 40};
  if (!std::isfinite(alpha)) fail(name, ": LoRA alpha must be finite (got ", alpha, ")");
  for (const LoraPair& p : pairs) {
    if (p.rank <= 0) fail(name, ": LoRA rank must be at least 1 (", p.target, ")");
    const int64_t na = p.rank * (p.embedding() ? p.n_out : p.n_in), nb = p.rank * (p.embedding() ? p.n_in : p.n_out);
    if (int64_t(p.a.size()) != na || int64_t(p.b.size()) != nb)
      fail(name, ": ", p.target, " has ", p.a.size(), " + ", p.b.size(), " values; rank ", p.rank, " needs ", na, " + ", nb);
  }
  for (LoraPair& p : pairs) {
    if (half) {
      for (float& x : p.a) x = fp16_to_f32(f32_to_fp16(x));
      for (float& x : p.b) x = fp16_to_f32(f32_to_fp16(x));
    }
    make_operands(p, half);
  }
  auto ad = std::make_shared<LoraAdapter>();
  ad->path_ = name;
  ad->arch_ = architecture;
  ad->alpha_ = alpha;
  ad->pairs_ = std::move(pairs);
  ad->uid_ = next_uid.fetch_add(1);
  return ad;
}

std::vector<LoraPair> LoraAdapter::random_pairs(const GgufFile& base, int64_t rank, uint64_t seed, float b_std) {
  static const char* const kKinds[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight",
                                       "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
  std::mt19937_64 rng(seed);
  std::vector<LoraPair> pairs;
  for (const GgufTensorInfo& t : base.tensors()) {
    if (t.ne.size() != 2 || t.name.rfind("blk.", 0) != 0) continue;
    bool kind = false;
    for (const char* k : kKinds) kind = kind || ends_with(t.name, std::string(".") + k);
    if (!kind) continue;
    LoraPair p;
    p.target = t.name;
    p.rank = rank;
    p.n_in = t.ne[0];
    p.n_out = t.ne[1];
    std::normal_distribution<float> na(0.0f, 1.0f / std::sqrt(float(p.n_in)));
    std::normal_distribution<float> nb(0.0f, b_std / std::sqrt(float(rank)));
    p.a.resize(size_t(rank * p.n_in));
    p.b.resize(size_t(rank * p.n_out));
    for (float& x : p.a) x = na(rng);
    for (float& x : p.b) x = nb(rng);
    pairs.push_back(std::move(p));
  }
  return pairs;
}

const LoraPair* LoraAdapter::find(const std::string& target) const {
  for (const LoraPair& p : pairs_)
    if (p.target == target) return &p;
  return nullptr;
}

int64_t LoraAdapter::max_rank() const {
  int64_t r = 0;
  for (const LoraPair& p : pairs_) r = std::max(r, p.rank);
  return r;
}

int64_t LoraAdapter::n_params() const {
  int64_t n = 0;
  for (const LoraPair& p : pairs_) n += int64_t(p.a.size() + p.b.size());
  return n;
}

float LoraAdapter::scale_of(const LoraPair& p, float user_scale) const {
  return alpha_ != 0.0f ? user_scale * alpha_ / float(p.rank) : user_scale;
}

void LoraAdapter::check_base(const GgufFile& base) const {
  const std::string base_arch = base.get_string("general.architecture", "");
  if (base_arch != arch_)
    fail(path_, ": the adapter is for architecture \"", arch_, "\", the base model ", base.path(), " is \"", base_arch,
         "\"");
  for (const LoraPair& p : pairs_) {
    const GgufTensorInfo* t = base.find_tensor(p.target);
    if (!t) fail(path_, ": adapts ", p.target, ", which the base model ", base.path(), " does not have");
    const int64_t ne0 = t->ne.empty() ? 1 : t->ne[0];
    const int64_t ne1 = t->ne.size() > 1 ? t->ne[1] : 1;
    if (t->ne.size() != 2 || ne0 != p.n_in || ne1 != p.n_out)
      fail(path_, ": ", p.target, " is ", shape_of(p.n_in, p.n_out), " in the adapter (rank ", p.rank, ") but ",
           t->shape_string(), " in the base model ", base.path(), " (an adapter made for another base?)");
  }
}

namespace {

// An adapter file's keys and tensors into `w`; each pair's tensors of type_of(pair) (f32, f16 or
// bf16). Converted copies go into `halves`, which must outlive the writer's output. `path`
// names the file (or the adapter) in errors.
template <class TypeOf>
void fill_adapter_writer(GgufWriter& w, const std::string& path, const std::string& architecture, float alpha,
                         const std::vector<LoraPair>& pairs, const TypeOf& type_of,
                         const std::vector<std::pair<std::string, GgufValue>>& extra,
                         std::vector<std::vector<uint16_t>>& halves) {
  if (!std::isfinite(alpha)) fail("LoRA alpha must be finite (got ", alpha, ")");
  w.set("general.architecture", GgufValue::string(architecture));
  w.set("general.type", GgufValue::string("adapter"));
  w.set("adapter.type", GgufValue::string("lora"));
  w.set("adapter.lora.alpha", GgufValue::f32(alpha));
  for (const auto& [k, v] : extra) w.set(k, v);
  halves.reserve(pairs.size() * 2);
  DType type = DType::F32;  // the pair being added's (the add lambda converts to it)
  const auto add = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> ne) {
    if (int64_t(v.size()) != ne[0] * ne[1])
      fail(path, ": ", name, " has ", v.size(), " values for a ", ne[0], " x ", ne[1], " tensor");
    if (type == DType::F32) {
      w.add_tensor(name, type, std::move(ne), v.data(), v.size() * sizeof(float));
      return;
    }
    std::vector<uint16_t>& h = halves.emplace_back(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = type == DType::F16 ? f32_to_fp16(v[i]) : f32_to_bf16(v[i]);
    w.add_tensor(name, type, std::move(ne), h.data(), h.size() * sizeof(uint16_t));
  };
  for (const LoraPair& p : pairs) {
    if (p.rank <= 0) fail(path, ": LoRA rank must be at least 1 (", p.target, ")");
    type = type_of(p);
    if (p.embedding()) {
      add(p.target + kSuffixA, p.a, {p.rank, p.n_out});
      add(p.target + kSuffixB, p.b, {p.rank, p.n_in});
    } else {
      add(p.target + kSuffixA, p.a, {p.n_in, p.rank});
      add(p.target + kSuffixB, p.b, {p.rank, p.n_out});
    }
  }
}

}  // namespace

void write_lora_adapter(const std::string& path, const std::string& architecture, float alpha,
                        const std::vector<LoraPair>& pairs, DType type,
                        const std::vector<std::pair<std::string, GgufValue>>& extra) {
  if (!dtype_is_float(type)) fail("LoRA adapters are written as f32, f16 or bf16, not ", dtype_name(type));
  GgufWriter w;
  std::vector<std::vector<uint16_t>> halves;
  fill_adapter_writer(w, path, architecture, alpha, pairs, [&](const LoraPair&) { return type; }, extra, halves);
  w.write(path);
}

std::vector<uint8_t> lora_adapter_bytes(const LoraAdapter& adapter) {
  GgufWriter w;
  std::vector<std::vector<uint16_t>> halves;
  // A half pair's values are halves already (LoraPair::half): f16 holds them exactly, and
  // from_file makes half operands of an f16 pair again.
  fill_adapter_writer(w, adapter.path(), adapter.architecture(), adapter.alpha(), adapter.pairs(),
                      [](const LoraPair& p) { return p.half ? DType::F16 : DType::F32; }, {}, halves);
  return w.to_bytes();
}

std::pair<std::string, float> parse_lora_arg(const std::string& arg) {
  const size_t colon = arg.rfind(':');
  if (colon != std::string::npos && colon > 0 && colon + 1 < arg.size()) {
    const std::string tail = arg.substr(colon + 1);
    float scale = 0.0f;
    const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), scale);
    if (ec == std::errc() && end == tail.data() + tail.size()) {
      if (!std::isfinite(scale)) fail("--lora ", arg, ": the scale must be a finite number");
      return {arg.substr(0, colon), scale};
    }
  }
  if (arg.empty()) fail("--lora needs a file name");
  return {arg, 1.0f};
}

}  // namespace tern
