#pragma once
// Non-finite weights (NaN, Inf) in a model file: a corrupt download or a broken converter.
// Left in, they turn every logit into NaN and greedy decoding into token 0 forever; caught at
// load, they are an error naming the file, the tensor and its shape.
#include <string>

#include "gguf/gguf.h"

namespace tern {

// Throws tern::Error when tensor `t` of `file_path` holds a non-finite value. Float tensors
// (F32, F16, BF16) are scanned whole; quantized ones by their block scales (d, dmin, the f16
// fields every value is multiplied by), which is where a non-finite value can hide: the
// integer quants cannot hold one. Types it does not know are left to the loader's checks.
void check_weights_finite(const std::string& file_path, const GgufTensorInfo& t);

}  // namespace tern
