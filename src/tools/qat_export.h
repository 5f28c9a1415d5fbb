#pragma once
// Quantization-aware training's two ends in the tools: which storage type each tensor trains
// under (the types `tern quantize --type TYPE` would give the model) and the export of the trained
// latent weights into that file, checked to hold exactly the weights the training forward used.
#include <cstdint>
#include <string>
#include <vector>

#include "compress/quantize.h"
#include "core/dtype.h"
#include "train/model.h"
#include "train/qat.h"

namespace tern {

// --qat's value: a `tern quantize --type` name, or "ternary" (BitNet absmean, stored as tq2_0).
// Throws tern::Error naming the choices.
DType parse_qat_type(const std::string& name);

// Per tensor of `model` (params order): F32 for 1-D tensors, else the type llama-quantize's rules
// give it for `target` (output / embedding rules, the _M mixes), with the row-size fallback; each
// fallback is described in `notes` ("blk.0.ffn_down.weight: rows of 172 ... stored as f16").
std::vector<DType> plan_qat_types(const train::TrainModel& model, DType target, std::vector<std::string>* notes);

// The path --qat writes when --qat-out is not given: OUT with ".gguf" (if any) replaced by
// "-<type>.gguf".
std::string default_qat_export_path(const std::string& out, DType target);

// Writes the quantized model to `out`: `checkpoint` (the latent f32 model just saved) for the
// metadata and tensor order, each planned tensor encoded (codec types: the latent rows; ternary:
// the ternarized rows, which the format's absmax quantizer holds exactly), then decoded again and
// compared bit for bit with qat.quantized() (after qat.update(latent)): a mismatch throws
// tern::Error naming the tensor. Returns what was written.
QuantizeReport export_qat_model(const train::TrainModel& latent, train::QatModel& qat, const std::string& checkpoint,
                                const std::string& out, DType target, ThreadPool& pool);

}  // namespace tern
