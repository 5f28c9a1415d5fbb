#pragma once
// Import of llama2.c checkpoints (karpathy/llama2.c, legacy "version 0" .bin export) and their
// tokenizer.bin into GGUF, laid out as llama.cpp's convert-llama2c-to-ggml writes them: same
// key order, tensor names and order, F32 tensors, SentencePiece-style vocabulary.
//
// model.bin:     7 x i32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
//                seq_len; vocab_size > 0 means the classifier shares the token embedding,
//                < 0 means a separate wcls follows), then f32 tensors in PyTorch [out][in]
//                order (= GGUF ne0 = in, ne1 = out, so no transposition is needed).
// tokenizer.bin: i32 max_token_length, then per token: f32 score, i32 len, len bytes.
//
// Every size is checked against the files before use; a malformed input is a tern::Error
// naming the file and what is wrong.
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tern {

struct Llama2cImportOptions {
  std::string name = "llama";  // general.name (llama.cpp's converter writes "llama")
  // llama.context_length; 0 = the checkpoint's seq_len (the positions it was trained on).
  // llama.cpp's converter writes its own n_ctx (2048) here instead.
  uint32_t context_length = 0;
};

// The complete GGUF v3 image of the converted model.
std::vector<uint8_t> llama2c_to_gguf_bytes(const std::string& model_bin,
                                           const std::string& tokenizer_bin,
                                           const Llama2cImportOptions& options = {});

// The converted model parsed in memory (the GgufFile owns the bytes); its path() is model_bin.
GgufFile load_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                      const Llama2cImportOptions& options = {});

}  // namespace tern
