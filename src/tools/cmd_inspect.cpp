// `tern inspect MODEL [--json] [--max-items N]`: what a GGUF file holds, without loading it.
//
// Text output (sections in this order):
//   header      GGUF version, alignment, data offset, file size
//   metadata    one line per key: key, type, value (arrays abbreviated to N items)
//   hparams     the model's hyper-parameters, when the architecture uses the llama key set
//   tensors     name, type, shape, bytes; then the totals
// --json prints the same as one JSON object (same abbreviation of arrays).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {
namespace {

using Json = nlohmann::ordered_json;

// F32 metadata is stored widened to double; printing the double would show float noise
// (1e-5f -> 9.99999974737875e-06), so go through the shortest decimal of the float.
double shortest_f32(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

Json value_to_json(const GgufValue& v, size_t max_items) {
  switch (v.type) {
    case GgufType::STRING: return v.as_string();
    case GgufType::BOOL: return v.as_bool();
    case GgufType::F32: return shortest_f32(v.as_float());
    case GgufType::F64: return v.as_float();
    case GgufType::ARRAY: {
      const GgufArray& a = v.as_array();
      Json items = Json::array();
      for (size_t i = 0; i < a.items.size() && (max_items == 0 || i < max_items); ++i)
        items.push_back(value_to_json(a.items[i], max_items));
      return items;
    }
    default:
      if (std::holds_alternative<uint64_t>(v.v)) return std::get<uint64_t>(v.v);
      return std::get<int64_t>(v.v);
  }
}

// One hyper-parameter: the value as text, or why it could not be read (a wrong type in a
// damaged file should not stop the rest of the report).
struct Hparam {
  const char* name;
  std::string key;   // the metadata key it comes from ("" when derived)
  std::string text;  // printed value
  Json json;
};

std::vector<Hparam> llama_hparams(const GgufFile& f) {
  std::vector<Hparam> out;
  const GgufValue* arch_value = f.find("general.architecture");
  if (!arch_value || arch_value->type != GgufType::STRING) return out;
  const std::string& arch = arch_value->as_string();
  if (arch.empty()) return out;
  const std::string p = arch + ".";
  if (!f.has(p + "embedding_length") && !f.has(p + "block_count")) return out;

  auto add_uint = [&](const char* name, const std::string& key, std::optional<uint64_t> fallback,
                      const char* fallback_why) -> std::optional<uint64_t> {
    Hparam h{name, key, "", nullptr};
    std::optional<uint64_t> value;
    try {
      if (const GgufValue* v = f.find(key); v && v->type == GgufType::ARRAY) {
        // Per-layer values (structured-pruned models): the largest, and the list.
        Json list = Json::array();
        std::string text;
        for (const GgufValue& item : std::get<GgufArray>(v->v).items) {
          const uint64_t x = item.as_uint(key);
          value = std::max(value.value_or(0), x);
          list.push_back(x);
          text += (text.empty() ? "" : " ") + std::to_string(x);
        }
        h.text = value ? str_cat("max ", *value, " (per layer: ", text, ")") : "(empty array)";
        h.json = list;
        out.push_back(std::move(h));
        return value;
      } else if (v) {
        value = v->as_uint(key);
        h.text = std::to_string(*value);
      } else if (fallback) {
        value = fallback;
        h.text = std::to_string(*value) + " (" + fallback_why + ")";
      } else {
        h.text = "(missing)";
      }
    } catch (const Error& e) {
      h.text = std::string("(invalid: ") + e.what() + ")";
    }
    h.json = value ? Json(*value) : Json(nullptr);
    out.push_back(std::move(h));
    return value;
  };
  auto add_float = [&](const char* name, const std::string& key, std::optional<double> fallback,
                       const char* fallback_why) {
    Hparam h{name, key, "", nullptr};
    try {
      if (const GgufValue* v = f.find(key)) {
        const double x = v->type == GgufType::F32 ? shortest_f32(v->as_float(key)) : v->as_float(key);
        h.json = x;
        h.text = Json(x).dump();
      } else if (fallback) {
        h.json = *fallback;
        h.text = Json(*fallback).dump() + " (" + fallback_why + ")";
      } else {
        h.text = "(missing)";
      }
    } catch (const Error& e) {
      h.text = std::string("(invalid: ") + e.what() + ")";
    }
    out.push_back(std::move(h));
  };

  // n_vocab: the tokenizer's list is the authority; the embedding's rows otherwise.
  std::optional<uint64_t> n_vocab;
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens"); t && t->type == GgufType::ARRAY)
    n_vocab = std::get<GgufArray>(t->v).items.size();
  else if (const GgufTensorInfo* e = f.find_tensor("token_embd.weight"); e && e->ne.size() == 2)
    n_vocab = static_cast<uint64_t>(e->ne[1]);
  add_uint("n_vocab", p + "vocab_size", n_vocab, "from the vocabulary");
  add_uint("n_ctx_train", p + "context_length", std::nullopt, "");
  const auto n_embd = add_uint("n_embd", p + "embedding_length", std::nullopt, "");
  add_uint("n_layer", p + "block_count", std::nullopt, "");
  const auto n_head = add_uint("n_head", p + "attention.head_count", std::nullopt, "");
  add_uint("n_head_kv", p + "attention.head_count_kv", n_head, "= n_head");
  std::optional<uint64_t> head_dim;
  if (n_embd && n_head && *n_head > 0) head_dim = *n_embd / *n_head;
  head_dim = add_uint("head_dim", p + "attention.key_length", head_dim, "n_embd / n_head");
  add_uint("n_ff", p + "feed_forward_length", std::nullopt, "");
  add_uint("n_rot", p + "rope.dimension_count", head_dim, "= head_dim");
  add_float("rope_freq_base", p + "rope.freq_base", 10000.0, "default");
  add_float("rms_eps", p + "attention.layer_norm_rms_epsilon", std::nullopt, "");
  return out;
}

std::string human_bytes(uint64_t n) {
  char buf[64];
  if (n >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(n) / double(1 << 30));
  else if (n >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(n) / double(1 << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", double(n) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

std::string type_label(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return gguf_type_name(v.type);
  return std::string("array[") + gguf_type_name(std::get<GgufArray>(v.v).elem_type) + "]";
}

// A LoRA adapter's summary (general.type = adapter): what it adapts, at which rank; or why it
// cannot be used.
struct AdapterSummary {
  std::shared_ptr<const LoraAdapter> adapter;
  std::string error;
};
std::optional<AdapterSummary> adapter_summary(const GgufFile& f) {
  if (f.get_string("general.type", "") != "adapter") return std::nullopt;
  AdapterSummary s;
  try {
    s.adapter = LoraAdapter::from_file(f);
  } catch (const Error& e) {
    s.error = e.what();
  }
  return s;
}

Json adapter_json(const AdapterSummary& s) {
  Json j;
  if (!s.adapter) {
    j["error"] = s.error;
    return j;
  }
  const LoraAdapter& a = *s.adapter;
  j["type"] = "lora";
  j["architecture"] = a.architecture();
  j["alpha"] = shortest_f32(a.alpha());
  j["max_rank"] = a.max_rank();
  j["n_params"] = a.n_params();
  Json ts = Json::array();
  for (const LoraPair& p : a.pairs())
    ts.push_back({{"target", p.target}, {"rank", p.rank}, {"n_in", p.n_in}, {"n_out", p.n_out},
                  {"scale", shortest_f32(a.scale_of(p, 1.0f))}});
  j["targets"] = std::move(ts);
  return j;
}

void print_adapter(const AdapterSummary& s) {
  if (!s.adapter) {
    std::printf("\nLoRA adapter: unusable: %s\n", s.error.c_str());
    return;
  }
  const LoraAdapter& a = *s.adapter;
  std::printf("\nLoRA adapter for %s: %zu targets, rank %lld, alpha %g, %lld parameters\n", a.architecture().c_str(),
              a.pairs().size(), static_cast<long long>(a.max_rank()), double(a.alpha()),
              static_cast<long long>(a.n_params()));
  size_t w = 6;
  for (const LoraPair& p : a.pairs()) w = std::max(w, p.target.size());
  std::printf("  %-*s  %5s  %-14s %s\n", static_cast<int>(w), "target", "rank", "n_in x n_out", "scale at 1");
  for (const LoraPair& p : a.pairs())
    std::printf("  %-*s  %5lld  %-14s %g\n", static_cast<int>(w), p.target.c_str(), static_cast<long long>(p.rank),
                (std::to_string(p.n_in) + " x " + std::to_string(p.n_out)).c_str(), double(a.scale_of(p, 1.0f)));
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"Print a GGUF file's header, metadata, hyper-parameters and tensor table"};
  std::string path;
  bool as_json = false;
  size_t max_items = 8;
  app.add_option("model", path, "GGUF file")->required();
  app.add_flag("--json", as_json, "print one JSON object instead of text");
  app.add_option("--max-items", max_items, "array items shown per metadata value (0 = all)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  const GgufFile f = GgufFile::open(path);
  const auto hparams = llama_hparams(f);
  const std::optional<AdapterSummary> adapter = adapter_summary(f);
  uint64_t total_elements = 0;
  for (const auto& t : f.tensors()) total_elements += static_cast<uint64_t>(t.n_elements());
  const uint64_t total_bytes = f.tensor_data_bytes();

  if (as_json) {
    Json j;
    j["path"] = path;
    j["version"] = f.version();
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    j["file_size"] = f.file_size();
    Json md = Json::array();
    for (const auto& [key, v] : f.metadata()) {
      Json e;
      e["key"] = key;
      e["type"] = type_label(v);
      if (v.type == GgufType::ARRAY) e["count"] = std::get<GgufArray>(v.v).items.size();
      e["value"] = value_to_json(v, max_items);
      md.push_back(std::move(e));
    }
    j["metadata"] = std::move(md);
    if (!hparams.empty()) {
      Json hp;
      hp["architecture"] = f.get_string("general.architecture");
      for (const auto& h : hparams) hp[h.name] = h.json;
      j["hparams"] = std::move(hp);
    }
    if (adapter) j["adapter"] = adapter_json(*adapter);
    Json ts = Json::array();
    for (const auto& t : f.tensors()) {
      Json e;
      e["name"] = t.name;
      e["type"] = dtype_name(t.type);
      e["shape"] = t.ne;
      e["offset"] = t.offset;
      e["bytes"] = t.n_bytes;
      ts.push_back(std::move(e));
    }
    j["tensors"] = std::move(ts);
    j["totals"] = {{"n_tensors", f.tensors().size()},
                   {"n_elements", total_elements},
                   {"n_bytes", total_bytes}};
    // Vocabularies may hold invalid UTF-8 (partial byte tokens); replace rather than throw.
    std::printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    return 0;
  }

  std::printf("file:        %s\n", path.c_str());
  std::printf("version:     %u\n", f.version());
  std::printf("alignment:   %llu\n", static_cast<unsigned long long>(f.alignment()));
  std::printf("data offset: %llu\n", static_cast<unsigned long long>(f.data_offset()));
  std::printf("file size:   %llu (%s)\n", static_cast<unsigned long long>(f.file_size()),
              human_bytes(f.file_size()).c_str());

  size_t key_width = 0;
  for (const auto& kv : f.metadata()) key_width = std::max(key_width, kv.first.size());
  std::printf("\nmetadata: %zu keys\n", f.metadata().size());
  for (const auto& [key, v] : f.metadata())
    std::printf("  %-*s  %-14s %s\n", static_cast<int>(key_width), key.c_str(), type_label(v).c_str(),
                v.to_display(max_items == 0 ? SIZE_MAX : max_items).c_str());

  if (!hparams.empty()) {
    std::printf("\nhyper-parameters (%s):\n", f.get_string("general.architecture").c_str());
    for (const auto& h : hparams) std::printf("  %-15s %s\n", h.name, h.text.c_str());
  }
  if (adapter) print_adapter(*adapter);

  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  std::printf("\ntensors: %zu\n", f.tensors().size());
  std::printf("  %-*s  %-7s %-24s %12s\n", static_cast<int>(name_width), "name", "type", "shape", "bytes");
  for (const auto& t : f.tensors())
    std::printf("  %-*s  %-7s %-24s %12llu\n", static_cast<int>(name_width), t.name.c_str(),
                dtype_name(t.type), t.shape_string().c_str(), static_cast<unsigned long long>(t.n_bytes));
  std::printf("\ntotal: %zu tensors, %llu elements, %llu bytes (%s)\n", f.tensors().size(),
              static_cast<unsigned long long>(total_elements), static_cast<unsigned long long>(total_bytes),
              human_bytes(total_bytes).c_str());
  return 0;
}

}  // namespace tern
