#include "models/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "models/weight_check.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

// Gives a read-only file mapping's pages back to the kernel as a copy moves past them (nothing
// is lost: a later reader faults them in from the file again), so that resident memory holds
// one copy of the weights, not the copy and the file.
class PageReleaser {
 public:
  explicit PageReleaser(const void* start)
      : page_(uintptr_t(::sysconf(_SC_PAGESIZE))),
        done_((reinterpret_cast<uintptr_t>(start) + page_ - 1) / page_ * page_) {}
  // Releases the whole pages before `end`.
  void release_to(const void* end) {
    const uintptr_t e = reinterpret_cast<uintptr_t>(end) / page_ * page_;
    if (e <= done_) return;
    ::madvise(reinterpret_cast<void*>(done_), e - done_, MADV_DONTNEED);
    done_ = e;
  }

 private:
  uintptr_t page_, done_;
};

}  // namespace

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
  if (loading_) return;
  check_weights_finite(file_->path(), t);
  if (copy_everything_)
    file_->release_pages_around(t.data, t.n_bytes);  // (a small tensor's read maps a whole folio)
  else if (release_checked_ && file_->file_mapped())
    PageReleaser(t.data).release_to(static_cast<const uint8_t*>(t.data) + t.n_bytes);
}

WeightView WeightLoader::rows(const std::string& name, int64_t n_in, int64_t n_out) {
  const GgufTensorInfo& t = tensor(name);
  require_quant_traits(t.type, name.c_str());
  if (t.ne.size() != 2 || t.ne[0] != n_in || t.ne[1] != n_out)
    fail(file_->path(), ": loading ", name, ": expected ", n_in, " x ", n_out, ", file has ", t.shape_string());
  check_once(t);
  return WeightView{t.type, n_in, n_out, kept(t.data, size_t(t.n_bytes))};
}

const uint8_t* WeightLoader::kept(const uint8_t* src, size_t bytes) {
  if (!copy_everything_) return src;
  uint8_t* dst = claim(bytes);
  if (!dst) return src;  // planning: counted
  std::memcpy(dst, src, bytes);
  file_->release_pages_around(src, bytes);
  return dst;
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
  if (!want_interleave16(w)) {
    w.data = kept(static_cast<const uint8_t*>(w.data), size_t(w.n_out * w.row_bytes()));
    return w;
  }
  const size_t bytes = size_t(w.n_out * w.row_bytes());
  if (!loading_) {
    claim(bytes);
    return w;
  }
  uint8_t* dst = claim(bytes);
  // The copy replaces the file's bytes, whose pages go back to the kernel (a read-only mapping:
  // nothing is lost, a later reader gets them from the file again), so resident memory stays
  // one copy of the weights. In pieces of ~8 MiB (whole 16-row groups, which interleave16 lays
  // out independently, each over the same byte range it reads), each piece's source pages going
  // back as soon as it is copied: done for the whole matrix at once, a vocabulary-sized matrix
  // (145 MB for Qwen2.5-0.5B's tied embeddings) was resident twice at the peak of the load.
  const int64_t rb = w.row_bytes();
  const int64_t piece_rows = std::max<int64_t>(16, (int64_t(8) << 20) / std::max<int64_t>(rb, 1) / 16 * 16);
  PageReleaser source(w.data);
  for (int64_t r0 = 0; r0 < w.n_out; r0 += piece_rows) {
    // The last piece takes the rows left (a float matrix's tail rows past the last full group).
    const int64_t r1 = w.n_out - r0 <= piece_rows + 15 ? w.n_out : r0 + piece_rows;
    WeightView piece = w;
    piece.n_out = r1 - r0;
    piece.data = static_cast<const uint8_t*>(w.data) + r0 * rb;
    interleave16(piece, dst + r0 * rb);
    if (file_->file_mapped()) source.release_to(static_cast<const uint8_t*>(w.data) + r1 * rb);
    if (r1 == w.n_out) break;
  }
  if (copy_everything_) file_->release_pages_around(t.data, t.n_bytes);
  w.data = dst;
  w.interleaved16 = true;
  return w;
}

uint8_t* WeightLoader::claim(size_t bytes) {
  const size_t padded = (bytes + 63) / 64 * 64;
  if (!loading_) {
    planned_ += padded;
    return nullptr;
  }
  if (arena_used_ + bytes <= planned_) {
    uint8_t* dst = arena_.get() + arena_used_;
    arena_used_ += padded;
    return dst;
  }
  extra_.push_back(alloc_huge_buffer(bytes));
  return extra_.back().get();
}

int64_t WeightLoader::column_unit(const std::string& name) const {
  const GgufTensorInfo& t = tensor(name);
  const QuantTraits* q = quant_traits(t.type);
  return q ? q->block_size : 1;
}

WeightView WeightLoader::matmul_cols(const std::string& name, int64_t n_in_total, int64_t n_out, int64_t col0,
                                     int64_t n_in, int64_t expert, int64_t n_expert) {
  const GgufTensorInfo& t = tensor(name);
  const QuantTraits& q = require_quant_traits(t.type, name.c_str());
  if (n_expert > 0) {
    if (t.ne.size() != 3 || t.ne[0] != n_in_total || t.ne[1] != n_out || t.ne[2] != n_expert)
      fail(file_->path(), ": loading ", name, ": expected ", n_in_total, " x ", n_out, " x ", n_expert, ", file has ",
           t.shape_string());
    TERN_ASSERT(expert >= 0 && expert < n_expert);
  } else if (t.ne.size() != 2 || t.ne[0] != n_in_total || t.ne[1] != n_out) {
    fail(file_->path(), ": loading ", name, ": expected ", n_in_total, " x ", n_out, ", file has ", t.shape_string());
  }
  const int64_t bs = q.block_size;
  if (dtype_row_bytes(t.type, n_in_total) != n_in_total / bs * q.block_bytes)
    fail(file_->path(), ": ", name, " is ", dtype_name(t.type),
         ", whose rows are not plain sequences of blocks: it cannot be split by columns for tensor parallelism "
         "(requantize it to a llama.cpp type first)");
  if (col0 % bs != 0 || n_in % bs != 0 || col0 < 0 || col0 + n_in > n_in_total)
    fail(file_->path(), ": ", name, " (", dtype_name(t.type), ", blocks of ", bs, "): columns [", col0, ", ",
         col0 + n_in, ") are not whole blocks within its ", n_in_total, " columns, so it cannot be split this way "
         "for tensor parallelism (a smaller --tp, or another type)");
  check_once(t);
  WeightView w{t.type, n_in, n_out, nullptr};
  const int64_t rb = w.row_bytes(), rb_total = dtype_row_bytes(t.type, n_in_total), off = col0 / bs * q.block_bytes;
  const size_t bytes = size_t(n_out * rb);
  uint8_t* dst = claim(bytes);
  if (!loading_) return w;
  // (an expert's matrix: its n_out rows, after the experts before it)
  const uint8_t* src = static_cast<const uint8_t*>(t.data) + (n_expert > 0 ? expert * n_out * rb_total : 0);
  const bool interleave = want_interleave16(w);
  // In pieces of whole 16-row groups (interleave16 lays each out over its own bytes); each
  // piece's source pages go back once it is copied: a share's columns lie on every page of the
  // tensor, which would otherwise stay resident whole.
  const int64_t piece_rows = std::max<int64_t>(16, (int64_t(8) << 20) / std::max<int64_t>(rb, 1) / 16 * 16);
  std::vector<uint8_t> gathered(interleave ? size_t(std::min(piece_rows + 15, n_out) * rb) : 0);
  PageReleaser source(src);
  for (int64_t r0 = 0; r0 < n_out; r0 += piece_rows) {
    const int64_t r1 = n_out - r0 <= piece_rows + 15 ? n_out : r0 + piece_rows;
    uint8_t* to = interleave ? gathered.data() : dst + r0 * rb;
    for (int64_t r = r0; r < r1; ++r) std::memcpy(to + (r - r0) * rb, src + r * rb_total + off, size_t(rb));
    if (interleave) {
      WeightView piece = w;
      piece.n_out = r1 - r0;
      piece.data = gathered.data();
      interleave16(piece, dst + r0 * rb);
    }
    if (file_->file_mapped()) source.release_to(src + r1 * rb_total);
    if (r1 == n_out) break;
  }
  w.data = dst;
  w.interleaved16 = interleave;
  return w;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, const char* what) {
  return vectors(name, n, 0, what);
}

const float* WeightLoader::vectors(const std::string& name, int64_t n, int64_t count, const char* what) {
  const GgufTensorInfo& t = tensor(name);
  if (t.type != DType::F32)
    fail(file_->path(), ": loading ", name, ": ", what, " must be f32, file has ", dtype_name(t.type));
  const bool fits = count == 0 ? t.ne.size() == 1 && t.ne[0] == n : t.ne.size() == 2 && t.ne[0] == n && t.ne[1] == count;
  if (!fits)
    fail(file_->path(), ": loading ", name, ": expected ", count == 0 ? str_cat(n) : str_cat(n, " x ", count),
         ", file has ", t.shape_string());
  if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) != 0)
    fail(file_->path(), ": tensor ", name, " data is misaligned");
  check_once(t);
  return reinterpret_cast<const float*>(kept(t.data, size_t(t.n_bytes)));
}

}  // namespace tern
