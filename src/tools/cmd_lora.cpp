// tern lora merge: folds LoRA adapters into a base model's weights (docs/lora.md).
//
//   W' = W + sum over adapters of scale * B A        (token_embd: W'[v] += scale * B A[v])
//
// An adapted tensor is dequantized, updated in f32 and written as the base's type when that is
// a float type (F32, F16, BF16), else as F16 (a quantized base's adapted matrices; --type
// quantizes the whole merged model afterwards, with `tern quantize`'s rules). Tensors no adapter
// touches are copied byte for byte. A tied model whose token_embd is adapted gets the original
// matrix as its output.weight (the adapter changes the embedding lookup, not the output).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compress/quantize.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/output_file.h"
#include "core/thread_pool.h"
#include "models/lora.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/progress.h"

namespace tern {
namespace {

// w [n_rows][n_in] += scale * B A (or, for token_embd, w[v][e] += scale * B[e] . A[v]).
void add_update(float* w, const LoraPair& p, float scale, ThreadPool& pool) {
  const int64_t R = p.rank;
  pool.parallel_for(p.n_out, [&](int64_t o0, int64_t o1, int) {
    std::vector<float> row(size_t(p.n_in));
    for (int64_t o = o0; o < o1; ++o) {
      std::fill(row.begin(), row.end(), 0.0f);
      if (p.embedding()) {
        const float* a = p.a.data() + o * R;  // A[v]: [rank]
        for (int64_t e = 0; e < p.n_in; ++e) {
          const float* b = p.b.data() + e * R;
          float d = 0.0f;
          for (int64_t k = 0; k < R; ++k) d += b[k] * a[k];
          row[size_t(e)] = d;
        }
      } else {
        const float* b = p.b.data() + o * R;  // B[o]: [rank]
        for (int64_t k = 0; k < R; ++k) {
          const float bk = b[k];
          const float* a = p.a.data() + k * p.n_in;
          for (int64_t i = 0; i < p.n_in; ++i) row[size_t(i)] += bk * a[i];
        }
      }
      float* wo = w + o * p.n_in;
      for (int64_t i = 0; i < p.n_in; ++i) wo[i] += scale * row[size_t(i)];
    }
  });
}

std::vector<uint8_t> encode_float(const std::vector<float>& w, DType type) {
  std::vector<uint8_t> out(w.size() * (type == DType::F32 ? 4 : 2));
  if (type == DType::F32) {
    std::memcpy(out.data(), w.data(), out.size());
    return out;
  }
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < w.size(); ++i) h[i] = type == DType::F16 ? f32_to_fp16(w[i]) : f32_to_bf16(w[i]);
  return out;
}

int lora_merge(int argc, char** argv) {
  CLI::App app{"Merge LoRA adapters into a base model: W + scale * B A, written as a new GGUF"};
  std::string base_path, out_path, type_name;
  std::vector<std::string> loras;
  int threads = 0;
  bool json = false;
  app.add_option("-m,--model", base_path, "base model (GGUF)")->required();
  app.add_option("--lora", loras, "adapter FILE or FILE:SCALE (repeat to merge several)")->required();
  app.add_option("-o,--output", out_path, "merged model (GGUF)")->required();
  app.add_option("--type", type_name,
                 "quantize the merged model to this type afterwards (tern quantize's rules; default: none)");
  app.add_option("-t,--threads", threads, "worker threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print a JSON report");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  std::vector<std::string> inputs = {base_path};
  for (const std::string& l : loras) inputs.push_back(parse_lora_arg(l).first);
  check_output_not_input(out_path, inputs);
  std::optional<DType> requant;
  if (!type_name.empty()) requant = parse_quantize_type(type_name);

  const std::shared_ptr<const GgufFile> base = open_model_file(base_path);
  const LoraSet set = load_lora_args(loras, *base);
  {
    // The same checks a run with these adapters makes (a pair the model would not apply).
    const std::unique_ptr<Model> model = load_model(base);
    for (const LoraUse& u : set) model->check_lora(*u.adapter);
  }
  ThreadPool pool(threads > 0 ? threads : default_thread_count());

  std::vector<OutTensor> tensors;
  tensors.reserve(base->tensors().size());
  int64_t n_merged = 0;
  Progress progress("merge", int64_t(base->tensors().size()), !json);
  nlohmann::json merged = nlohmann::json::array();
  for (const GgufTensorInfo& t : base->tensors()) {
    OutTensor o;
    o.name = t.name;
    o.ne = t.ne;
    o.type = t.type;
    std::vector<const LoraUse*> uses;
    for (const LoraUse& u : set)
      if (u.adapter->find(t.name)) uses.push_back(&u);
    if (uses.empty()) {
      o.data = t.data;
      o.n_bytes = t.n_bytes;
    } else {
      std::vector<float> w = tensor_to_f32(t, pool);
      for (const LoraUse* u : uses) {
        const LoraPair& p = *u->adapter->find(t.name);
        add_update(w.data(), p, u->adapter->scale_of(p, u->scale), pool);
      }
      o.type = dtype_is_float(t.type) ? t.type : DType::F16;
      o.own(encode_float(w, o.type));
      merged.push_back({{"tensor", t.name}, {"from", dtype_name(t.type)}, {"type", dtype_name(o.type)},
                        {"adapters", uses.size()}});
      ++n_merged;
    }
    const bool tied_embd = !uses.empty() && t.name == "token_embd.weight" && !base->find_tensor("output.weight");
    tensors.push_back(std::move(o));
    if (tied_embd) {
      // A tied output reads token_embd, but the adapter changes only the embedding lookup: the
      // merged model keeps the original matrix as its own output.
      OutTensor out;
      out.name = "output.weight";
      out.ne = t.ne;
      out.type = t.type;
      out.data = t.data;
      out.n_bytes = t.n_bytes;
      tensors.push_back(std::move(out));
    }
    progress.update(int64_t(tensors.size()), t.name);
  }
  progress.finish();

  // Where a quantized type follows, the merged floats go to a temporary file first.
  const std::string float_path = requant ? out_path + ".merge-f.tmp" : out_path;
  std::vector<std::pair<std::string, GgufValue>> kv;
  std::string sources;
  for (const std::string& l : loras) sources += (sources.empty() ? "" : ",") + l;
  kv.emplace_back("tern.lora.merged", GgufValue::string(sources));
  write_model(*base, tensors, kv, float_path);
  QuantizeReport qrep;
  if (requant) {
    QuantizeOptions qo;
    qo.type = *requant;
    qo.allow_requantize = true;
    qo.n_threads = threads;
    try {
      qrep = quantize_model(float_path, out_path, qo);
    } catch (...) {
      std::remove(float_path.c_str());
      throw;
    }
    std::remove(float_path.c_str());
  }
  if (json) {
    nlohmann::json j = {{"model", base_path}, {"output", out_path}, {"adapters", loras}, {"merged_tensors", merged}};
    if (requant) j["type"] = dtype_name(*requant);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("merged %zu adapter(s) into %lld tensor(s) of %s -> %s%s\n", loras.size(),
                static_cast<long long>(n_merged), base_path.c_str(), out_path.c_str(),
                requant ? (std::string(" (quantized to ") + dtype_name(*requant) + ")").c_str() : "");
  }
  return 0;
}

}  // namespace

int cmd_lora(int argc, char** argv) {
  const std::string usage =
      "usage: tern lora merge -m BASE --lora FILE[:SCALE] ... -o OUT [--type TYPE]\n"
      "  merge   fold adapters into the base's weights (a GGUF that runs without --lora)\n"
      "LoRA adapters also load in `tern run|chat|ppl|logits|bench --lora FILE[:SCALE]`, `tern serve --lora "
      "NAME=FILE`, and are trained by `tern finetune --lora`; `tern inspect ADAPTER` shows one.\n";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(usage.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  if (sub == "merge") {
    std::string name = "tern lora merge";
    std::vector<char*> args(argv + 1, argv + argc);
    args[0] = name.data();
    return lora_merge(int(args.size()), args.data());
  }
  std::fprintf(stderr, "tern lora: unknown subcommand '%s'\n%s", sub.c_str(), usage.c_str());
  return 2;
}

}  // namespace tern
