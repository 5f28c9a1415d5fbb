#include "tools/qat_export.h"

#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "gguf/gguf.h"
#include "quant/quant_traits.h"

namespace tern {

DType parse_qat_type(const std::string& name) {
  if (name == "ternary") return DType::TQ2_0;
  std::optional<DType> t;
  try {
    t = parse_quantize_type(name);
  } catch (const Error&) {
  }
  if (!t || *t == DType::F32) fail("--qat: unknown type '", name, "' (known: ternary, ", quantize_type_names(), ")");
  return *t;
}

std::vector<DType> plan_qat_types(const train::TrainModel& model, DType target, std::vector<std::string>* notes) {
  QuantizeOptions opts;
  opts.type = target;
  const bool has_output = model.find("output.weight") != nullptr;
  std::vector<DType> types;
  types.reserve(model.params.size());
  for (const train::ParamInfo& p : model.params) {
    if (p.ne.size() < 2) {
      types.push_back(DType::F32);
      continue;
    }
    const DType want = default_tensor_type(p.name, p.ne, has_output, int(model.shape.n_layer), opts).first;
    const int64_t n_in = p.ne[0];
    const DType type = dtype_row_bytes(want, n_in) >= 0 ? want : fit_row_type(want, n_in);
    if (type != want && notes != nullptr)
      notes->push_back(str_cat(p.name, ": rows of ", n_in, " do not fit ", dtype_name(want), "'s blocks of ", dtype_info(want).block_size, "; substitute ",
                               dtype_name(type)));
    types.push_back(type);
  }
  return types;
}

std::string default_qat_export_path(const std::string& out, DType target) {
  const std::string stem = out.size() > 5 && out.compare(out.size() - 5, 5, ".gguf") == 0 ? out.substr(0, out.size() - 5) : out;
  return stem + "-" + dtype_name(target) + ".gguf";
}

QuantizeReport export_qat_model(const train::TrainModel& latent, train::QatModel& qat, const std::string& checkpoint,
                                const std::string& out, DType target, ThreadPool& pool) {
  check_output_not_input(out, {checkpoint});
  const int64_t t0 = now_ns();
  qat.update(latent);  // the last optimizer step came after the last forward
  const GgufFile src = GgufFile::open(checkpoint);
  QuantizeReport rep;
  std::vector<OutTensor> tensors;
  tensors.reserve(src.tensors().size());
  for (const GgufTensorInfo& t : src.tensors()) {
    const train::ParamInfo* p = latent.find(t.name);
    if (p == nullptr) fail(checkpoint, ": tensor ", t.name, " is not one of the trained model's");
    const DType type = qat.types()[size_t(p - latent.params.data())];
    OutTensor o;
    o.name = t.name;
    o.ne = t.ne;
    o.type = type;
    TensorReport r;
    r.name = t.name;
    r.ne = t.ne;
    r.src_type = t.type;
    r.requested = r.type = type;
    r.src_bytes = int64_t(t.n_bytes);
    const float* wq = qat.quantized().data.data() + p->offset;
    if (type == DType::F32) {
      o.data = t.data;
      o.n_bytes = t.n_bytes;
      r.reason = "f32";
    } else {
      const int64_t n_in = p->ne[0], n_rows = p->size / n_in;
      const size_t pi = size_t(p - latent.params.data());
      if (qat.scale_offset(pi) >= 0) {  // LSQ: the learned scales and codes, packed as they are
        std::vector<uint8_t> bytes(size_t(n_rows * dtype_row_bytes(type, n_in)));
        for (int64_t rr = 0; rr < n_rows; ++rr) qat.encode_lsq_row(pi, rr, bytes.data() + rr * dtype_row_bytes(type, n_in));
        o.own(std::move(bytes));
      } else {
        const float* values = train::qat_is_ternary(type) ? wq : latent.data.data() + p->offset;
        o.own(encode_rows(values, n_in, n_rows, type, pool));
      }
      // The file must hold the forward's weights: decode and compare every bit.
      const QuantTraits& q = require_quant_traits(type, t.name.c_str());
      const int64_t rb = dtype_row_bytes(type, n_in);
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t rr = 0; rr < n_rows; ++rr) {
        q.to_float(o.data + rr * rb, row.data(), n_in);
        if (std::memcmp(row.data(), wq + rr * n_in, size_t(n_in) * sizeof(float)) != 0)
          fail("QAT export: ", t.name, " row ", rr, " decodes from ", dtype_name(type),
               " to other values than the training forward used");
      }
      r.reason = "qat";
    }
    r.bytes = int64_t(o.n_bytes);
    rep.src_bytes += r.src_bytes;
    rep.bytes += r.bytes;
    rep.tensors.push_back(std::move(r));
    tensors.push_back(std::move(o));
  }
  rep.file_type = llama_file_type(target);
  write_model(src, tensors,
              {{"general.file_type", GgufValue::u32(rep.file_type)},
               {"general.quantization_version", GgufValue::u32(2)},
               {"tern.qat.type", GgufValue::string(dtype_name(target))}},
              out);
  rep.seconds = double(now_ns() - t0) / 1e9;
  return rep;
}

}  // namespace tern
