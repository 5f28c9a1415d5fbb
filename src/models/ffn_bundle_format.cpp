#include "models/ffn_bundle_format.h"

#include <cstring>

#include "core/error.h"
#include "kernels/sparse_ffn.h"
#include "models/ffn_predictor_format.h"
#include "models/hparams.h"
#include "models/tensor_names.h"

namespace tern {

std::string ffn_bundle_name(int64_t il) { return str_cat("blk.", il, ".ffn_bundle"); }

bool is_ffn_bundle_tensor(const std::string& name) {
  return name.size() > 11 && name.compare(name.size() - 11, 11, ".ffn_bundle") == 0;
}

bool has_ffn_bundles(const GgufFile& f) { return f.has(kFfnBundleDownTypeKey); }

DType default_down_t_type(DType down) { return down == DType::Q4_0 ? DType::Q8_0 : down; }

int64_t model_weight_bytes(const GgufFile& f) {
  int64_t n = 0;
  for (const GgufTensorInfo& t : f.tensors())
    if (!is_ffn_predictor_tensor(t.name) && !is_ffn_bundle_tensor(t.name)) n += int64_t(t.n_bytes);
  return n;
}

FfnBundleTensor read_ffn_bundle(const GgufFile& f, int64_t il) {
  if (!has_ffn_bundles(f))
    fail(f.path(), ": no neuron bundles (", kFfnBundleDownTypeKey, " missing): --ram-budget reads cold neurons from "
         "them; write them with `tern predictor bundle -m ", f.path(), " -o OUT`");
  const GgufTensorInfo* gate = f.find_tensor(tensor_name(Tensor::FfnGate, il));
  if (!gate || gate->ne.size() != 2) fail(f.path(), ": layer ", il, " has no 2-D ffn_gate to bundle");
  const uint64_t down_id = f.get_uint(kFfnBundleDownTypeKey);
  FfnBundleTensor b;
  FfnBundleLayout& L = b.layout;
  L.type = gate->type;
  L.n_embd = gate->ne[0];
  L.n_ff = gate->ne[1];
  L.down_t_type = static_cast<DType>(down_id);
  if (down_id > 0xffff || !is_sparse_ffn_type(L.down_t_type))
    fail(f.path(), ": ", kFfnBundleDownTypeKey, " is ", down_id, ", not a type the sparse kernels read (F32, F16, Q8_0, Q4_0)");
  L.gate_up_bytes = dtype_row_bytes(L.type, L.n_embd);
  L.down_t_bytes = dtype_row_bytes(L.down_t_type, L.n_embd);
  const std::string name = ffn_bundle_name(il);
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) fail(f.path(), ": missing ", name, " (the file's bundles do not cover layer ", il, ")");
  if (t->type != DType::I8 || t->ne.size() != 2 || t->ne[0] != L.bundle_bytes() || t->ne[1] != L.n_ff)
    fail(f.path(), ": ", name, " is ", dtype_name(t->type), " ", t->shape_string(), ", expected i8 ", L.bundle_bytes(),
         " x ", L.n_ff, " (", dtype_name(L.type), " gate and up rows and ", dtype_name(L.down_t_type),
         " down_t rows of ", L.n_embd, ")");
  b.file_offset = f.data_offset() + t->offset;
  return b;
}

FfnBundleReport write_with_ffn_bundles(const GgufFile& model, DType down_t_type, const std::string& out) {
  if (!is_sparse_ffn_type(down_t_type))
    fail("--down-type ", dtype_name(down_t_type), ": the sparse FFN reads F32, F16, Q8_0 or Q4_0 rows");
  const HParams hp = read_hparams(model);
  GgufWriter w(model.version() >= 2 ? model.version() : 3);
  w.copy_metadata(model);
  w.set(kFfnBundleDownTypeKey, GgufValue::u32(uint32_t(down_t_type)));
  w.set(kFfnBundleModelKey, GgufValue::string(ffn_gate_fingerprint(model)));
  for (const GgufTensorInfo& t : model.tensors())
    if (!is_ffn_bundle_tensor(t.name)) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  FfnBundleReport rep;
  rep.down_t_type = down_t_type;
  std::vector<std::vector<uint8_t>> bundles(size_t(hp.n_layer));
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const GgufTensorInfo* g = model.find_tensor(tensor_name(Tensor::FfnGate, il));
    const GgufTensorInfo* u = model.find_tensor(tensor_name(Tensor::FfnUp, il));
    const GgufTensorInfo* d = model.find_tensor(tensor_name(Tensor::FfnDown, il));
    if (!g || !u || !d) continue;  // a layer of experts, a recurrent mixer or a fused gate-up
    const int64_t E = hp.n_embd, F = hp.ff_length(il);
    for (const GgufTensorInfo* t : {g, u})
      if (t->ne.size() != 2 || t->ne[0] != E || t->ne[1] != F)
        fail(model.path(), ": ", t->name, " is ", t->shape_string(), ", expected ", E, " x ", F);
    if (d->ne.size() != 2 || d->ne[0] != F || d->ne[1] != E)
      fail(model.path(), ": ", d->name, " is ", d->shape_string(), ", expected ", F, " x ", E);
    for (const GgufTensorInfo* t : {g, u, d})
      if (!is_sparse_ffn_type(t->type))
        fail(model.path(), ": ", t->name, " is ", dtype_name(t->type),
             "; bundles hold F32, F16, Q8_0 or Q4_0 rows (tern quantize --type q4_0 or q8_0)");
    if (u->type != g->type)
      fail(model.path(), ": ", u->name, " is ", dtype_name(u->type), " but ", g->name, " is ", dtype_name(g->type),
           "; a bundle holds them in one type");
    if ((down_t_type == DType::Q8_0 || down_t_type == DType::Q4_0) && E % 32 != 0)
      fail(model.path(), ": n_embd ", E, " is not a multiple of 32, which ", dtype_name(down_t_type), " down_t rows need");
    FfnBundleLayout L;
    L.type = g->type;
    L.down_t_type = down_t_type;
    L.n_embd = E;
    L.n_ff = F;
    L.gate_up_bytes = dtype_row_bytes(L.type, E);
    L.down_t_bytes = dtype_row_bytes(down_t_type, E);
    const std::vector<uint8_t> down_t = build_down_t(WeightView{d->type, F, E, d->data}, down_t_type);
    std::vector<uint8_t>& bb = bundles[size_t(il)];
    bb.resize(size_t(L.bundle_bytes() * F));
    for (int64_t j = 0; j < F; ++j) {
      uint8_t* row = bb.data() + j * L.bundle_bytes();
      std::memcpy(row, g->data + j * L.gate_up_bytes, size_t(L.gate_up_bytes));
      std::memcpy(row + L.up_offset(), u->data + j * L.gate_up_bytes, size_t(L.gate_up_bytes));
      std::memcpy(row + L.down_t_offset(), down_t.data() + j * L.down_t_bytes, size_t(L.down_t_bytes));
    }
    w.add_tensor(ffn_bundle_name(il), DType::I8, {L.bundle_bytes(), F}, bb.data(), bb.size());
    ++rep.layers;
    rep.n_ff_total += F;
    rep.bundle_bytes += int64_t(bb.size());
  }
  if (rep.layers == 0)
    fail(model.path(), ": no dense FFN layer (blk.N.ffn_gate, ffn_up and ffn_down) to bundle");
  w.write(out);
  return rep;
}

}  // namespace tern
