#pragma once
// Finds, checks and maps a model's tensors: shapes against the hyper-parameters (errors name
// the file, the tensor and both shapes), types against the kernels, values for NaN/Inf; and
// gives matmul weights the layout the kernels read fastest (kernels/matmul.h interleave16).
//
// A model binds its weights twice: first with a planning loader (checks everything, copies
// nothing, adds up the interleaved bytes), then with the loading one, which puts every
// interleaved copy into one 2 MiB-aligned buffer (one buffer per tensor, each rounded up to
// whole huge pages, made TinyLlama Q4_0's peak RSS 911 MB instead of 627).
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/huge_buffer.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"

namespace tern {

class WeightLoader {
 public:
  explicit WeightLoader(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}

  // Ends the planning pass: from now on matmul() interleaves into the planned buffer.
  void start_loading();

  // A part of a model (models/partition.h) reads a share of most tensors: each tensor's pages go
  // back to the kernel once its values are checked (they are read-only file pages), so that the
  // process keeps only what it then reads or copies, not the whole file.
  void release_checked_pages(bool on) { release_checked_ = on; }
  // Every tensor it binds is copied into the arena, the ones the kernels read as stored too
  // (embeddings, norms, matrices not interleaved), so that nothing reads the file's mapping after
  // the load (--ram-budget: the model then releases it whole, GgufFile::release_pages).
  void copy_everything(bool on) { copy_everything_ = on; }

  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }
  // A 2-D tensor used by row lookups (embeddings): as stored.   [n_in, n_out]
  WeightView rows(const std::string& name, int64_t n_in, int64_t n_out);
  // A matmul weight, rows [row0, row0 + n_out) of `name`, which must be [n_in, rows_total]
  // (2-D) or, with n_expert > 0, expert `expert` of [n_in, rows_total, n_expert] (3-D).
  WeightView matmul(const std::string& name, int64_t n_in, int64_t n_out, int64_t row0 = 0, int64_t rows_total = -1,
                    int64_t expert = -1, int64_t n_expert = 0);
  // Columns [col0, col0 + n_in) of every row of the 2-D `name` [n_in_total, n_out], or with
  // n_expert > 0 of expert `expert` of the 3-D [n_in_total, n_out, n_expert]: a tensor-parallel
  // rank's share of a row-split matrix (attn_output, ffn_down, an expert's down;
  // models/partition.h).
  // A row's columns are not contiguous across rows, so the share is always copied (and
  // interleaved where the kernels want it). col0 and n_in must be whole blocks of the type, and
  // the type's rows plain sequences of blocks (tern's own row formats with per-row headers and
  // the 2:4 formats are refused, naming the tensor).
  WeightView matmul_cols(const std::string& name, int64_t n_in_total, int64_t n_out, int64_t col0, int64_t n_in,
                         int64_t expert = -1, int64_t n_expert = 0);
  // Elements per block of `name`'s type (1 for f32); what a column split must be a multiple of.
  int64_t column_unit(const std::string& name) const;
  // An f32 vector (norm weight, bias, frequency factors) of n elements.
  // `what` names the kind in errors ("norm weights must be f32").
  const float* vector(const std::string& name, int64_t n, const char* what = "vectors");
  const float* optional_vector(const std::string& name, int64_t n, const char* what = "vectors") {
    return has(name) ? vector(name, n, what) : nullptr;
  }
  // `count` f32 vectors of n elements stored as one 2-D tensor [n, count] (gpt-oss's expert
  // biases, one row per expert).
  const float* vectors(const std::string& name, int64_t n, int64_t count, const char* what = "vectors");

  const GgufFile& file() const { return *file_; }

 private:
  const GgufTensorInfo& tensor(const std::string& name) const;
  // Room for `bytes` of copied weights: counted while planning (nullptr), the arena's next
  // 64-byte-aligned piece while loading.
  uint8_t* claim(size_t bytes);
  void check_once(const GgufTensorInfo& t);  // type and values, once per tensor
  // `src` as the model keeps it: itself, or with copy_everything its copy in the arena.
  const uint8_t* kept(const uint8_t* src, size_t bytes);

  std::shared_ptr<const GgufFile> file_;
  bool loading_ = false;
  bool release_checked_ = false;
  bool copy_everything_ = false;
  size_t planned_ = 0;                   // interleaved bytes the plan found
  HugeBuffer arena_;
  size_t arena_used_ = 0;
  std::vector<HugeBuffer> extra_;        // any copy the plan did not count (cannot happen)
  std::unordered_set<const GgufTensorInfo*> checked_;  // a 3-D expert tensor is bound once per expert

 public:
  // The buffers keep the interleaved copies alive: the model moves them out after loading.
  HugeBuffer take_arena() { return std::move(arena_); }
  std::vector<HugeBuffer> take_extra() { return std::move(extra_); }
};

}  // namespace tern
