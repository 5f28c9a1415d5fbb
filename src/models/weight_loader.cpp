#include "models/weight_loader.h"

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "models/weight_check.h"
#include "quant/quant_traits.h"

namespace tern {

void WeightLoader::start_loading() {
  loading_ = true;
  if (planned_ > 0) arena_ = alloc_huge_buffer(planned_);
}

const GgufTensorInfo& WeightLoader::tensor(const std::string& name) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) fail(file_->path(), ": missing tensor ", name);
  return *t;
}

void WeightLoader::check_once(const GgufTensorInfo& t) {
  if (!checked_.insert(&t).second) return;
  if (!loading_) check_weights_finite(file_->path(), t);
}

WeightView WeightLoader::rows(const std::string& name, int64_t n_in, int64_t n_out) {
  const GgufTensorInfo& t = tensor(name);
  require_quant_traits(t.type, name.c_str());
  if (t.ne.size() != 2 || t.ne[0] != n_in || t.ne[1] != n_out)
    fail(file_->path(), ": loading ", name, ": expected ", n_in, " x ", n_out, ", file has ", t.shape_string());
  check_once(t);
  return WeightView{t.type, n_in, n_out, t.data};
}

WeightView WeightLoader::matmul(const std::string& name, int64_t n_in, int64_t n_out, int64_t row0, int64_t rows_total,
                                int64_t expert, int64_t n_expert) {
  const GgufTensorInfo& t = tensor(name);
  require_quant_traits(t.type, name.c_str());
  if (rows_total < 0) rows_total = n_out;
  const bool shape_ok = n_expert > 0 ? (t.ne.size() == 3 && t.ne[0] == n_in && t.ne[1] == rows_total && t.ne[2] == n_expert)
                                     : (t.ne.size() == 2 && t.ne[0] == n_in && t.ne[1] == rows_total);
  if (!shape_ok) {
    if (n_expert > 0)
      fail(file_->path(), ": loading ", name, ": expected ", n_in, " x ", rows_total, " x ", n_expert, ", file has ",
           t.shape_string());
    fail(file_->path(), ": loading ", name, ": expected ", n_in, " x ", rows_total, ", file has ", t.shape_string());
  }
  check_once(t);
  TERN_ASSERT(row0 >= 0 && row0 + n_out <= rows_total);
  const int64_t row_bytes = dtype_row_bytes(t.type, n_in);
  const int64_t first_row = (expert > 0 ? expert * rows_total : 0) + row0;
  WeightView w{t.type, n_in, n_out, static_cast<const uint8_t*>(t.data) + first_row * row_bytes};
  if (!want_interleave16(w)) return w;
  const size_t bytes = size_t(w.n_out * w.row_bytes());
  const size_t padded = (bytes + 63) / 64 * 64;
  if (!loading_) {
    planned_ += padded;
    return w;
  }
  uint8_t* dst;
  if (arena_used_ + bytes <= planned_) {
    dst = arena_.get() + arena_used_;
    arena_used_ += padded;
  } else {
    extra_.push_back(alloc_huge_buffer(bytes));
    dst = extra_.back().get();
  }
  interleave16(w, dst);
  // The copy replaces the file's bytes, whose pages go back to the kernel (a read-only mapping:
  // nothing is lost, a later reader gets them from the file again), so resident memory stays
  // one copy of the weights.
  if (file_->file_mapped()) {
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(w.data) + bytes) / page * page;
    if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }
  w.data = dst;
  w.interleaved16 = true;
  return w;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, const char* what) {
  const GgufTensorInfo& t = tensor(name);
  if (t.type != DType::F32)
    fail(file_->path(), ": loading ", name, ": ", what, " must be f32, file has ", dtype_name(t.type));
  if (t.ne.size() != 1 || t.ne[0] != n)
    fail(file_->path(), ": loading ", name, ": expected ", n, ", file has ", t.shape_string());
  if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) != 0)
    fail(file_->path(), ": tensor ", name, " data is misaligned");
  check_once(t);
  return reinterpret_cast<const float*>(t.data);
}

}  // namespace tern
