#include "models/neuron_store.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>

#include "core/error.h"

namespace tern {

namespace {

// preadv's iovec limit (IOV_MAX is 1024 on Linux).
constexpr int64_t kMaxIov = 1024;

}  // namespace

NeuronStore::NeuronStore(const std::string& path, std::vector<NeuronStoreLayer> layers) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open ", path, " for its neuron bundles: ", std::strerror(errno));
  try {
    load(std::move(layers));
  } catch (...) {
    ::close(fd_);  // (no destructor runs for a constructor that throws)
    fd_ = -1;
    throw;
  }
}

void NeuronStore::load(std::vector<NeuronStoreLayer> layers) {
  const std::string& path = path_;
  for (NeuronStoreLayer& spec : layers) {
    const FfnBundleLayout& lay = spec.bundles.layout;
    if (spec.il < 0 || lay.n_ff <= 0 || lay.bundle_bytes() <= 0)
      fail(path, ": neuron store: layer ", spec.il, " has no bundles");
    if (spec.slots < 1 || spec.slots > lay.n_ff || spec.cache_slots < 0 || spec.cache_slots > spec.slots ||
        (spec.cache_slots == 0 && spec.slots < lay.n_ff))
      fail(path, ": neuron store: layer ", spec.il, ": ", spec.slots, " slots with ", spec.cache_slots,
           " for the cache do not fit ", lay.n_ff, " neurons");
    if (!spec.freq) fail(path, ": neuron store: layer ", spec.il, " has no activation frequencies");
    if (spec.il >= int64_t(index_.size())) index_.resize(size_t(spec.il + 1), -1);
    if (index_[size_t(spec.il)] >= 0) fail(path, ": neuron store: layer ", spec.il, " given twice");
    index_[size_t(spec.il)] = int32_t(layers_.size());
    Layer& L = layers_.emplace_back();
    L.spec = spec;
    const int64_t F = lay.n_ff, S = spec.slots;
    L.slots = alloc_huge_buffer(size_t(S * lay.bundle_bytes()));
    L.slot_of.assign(size_t(F), -1);
    L.neuron_of.assign(size_t(S), -1);
    L.prev.assign(size_t(S), -1);
    L.next.assign(size_t(S), -1);
    L.stamp.assign(size_t(S), -1);
    L.n_hot = S - spec.cache_slots;
    // The hot neurons: the most frequent, ties to the lower index; read in ascending order.
    std::vector<int32_t> order(static_cast<size_t>(F));
    std::iota(order.begin(), order.end(), 0);
    const float* fr = spec.freq;
    const auto freq = [fr](int32_t j) { return std::isnan(fr[j]) ? -1.0f : fr[j]; };  // (a NaN would break the order)
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return freq(a) > freq(b); });
    std::vector<int32_t> hot(order.begin(), order.begin() + L.n_hot);
    std::sort(hot.begin(), hot.end());
    std::vector<int32_t> hot_slots(hot.size());
    std::iota(hot_slots.begin(), hot_slots.end(), 0);
    for (size_t k = 0; k < hot.size(); ++k) {
      L.slot_of[size_t(hot[k])] = int32_t(k);
      L.neuron_of[k] = hot[k];
    }
    read_bundles(L, hot.data(), hot_slots.data(), int64_t(hot.size()), nullptr);
    // The cache slots, empty, in the LRU list.
    for (int64_t s = L.n_hot; s < S; ++s) {
      L.prev[size_t(s)] = L.tail;
      if (L.tail >= 0) L.next[size_t(L.tail)] = int32_t(s); else L.head = int32_t(s);
      L.tail = int32_t(s);
    }
  }
  stats_ = {};  // the hot neurons' reads are the load's, not a token's
}

NeuronStore::~NeuronStore() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t NeuronStore::resident_bytes() const {
  int64_t n = 0;
  for (const Layer& L : layers_) n += L.spec.slots * L.spec.bundles.layout.bundle_bytes();
  return n;
}

int64_t NeuronStore::hot_neurons() const {
  int64_t n = 0;
  for (const Layer& L : layers_) n += L.n_hot;
  return n;
}

int64_t NeuronStore::cache_neurons() const {
  int64_t n = 0;
  for (const Layer& L : layers_) n += L.spec.cache_slots;
  return n;
}

void NeuronStore::touch(Layer& L, int32_t s) {
  // Moves cache slot s to the list's end (most recently used).
  if (L.tail == s) return;
  const int32_t p = L.prev[size_t(s)], n = L.next[size_t(s)];
  if (p >= 0) L.next[size_t(p)] = n; else L.head = n;
  if (n >= 0) L.prev[size_t(n)] = p;
  L.prev[size_t(s)] = L.tail;
  L.next[size_t(s)] = -1;
  L.next[size_t(L.tail)] = s;
  L.tail = s;
}

void NeuronStore::read_run(const Layer& L, const int32_t* neurons, const int32_t* slots, int64_t n,
                           std::vector<iovec>& iov, int64_t& reads) const {
  // neurons[0 .. n): consecutive, so one contiguous range of the file into n slots.
  const int64_t bb = L.spec.bundles.layout.bundle_bytes();
  iov.clear();
  for (int64_t i = 0; i < n; ++i) iov.push_back(iovec{L.slots.get() + int64_t(slots[i]) * bb, size_t(bb)});
  const off_t off = off_t(L.spec.bundles.file_offset + uint64_t(neurons[0]) * uint64_t(bb));
  const size_t want = size_t(n * bb);
  size_t got = 0, first = 0;  // bytes read; the first iovec not yet filled
  while (got < want) {
    const ssize_t r = ::preadv(fd_, iov.data() + first, int(iov.size() - first), off + off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(path_, ": reading neuron bundles of layer ", L.spec.il, " at byte ", uint64_t(off) + got, ": ",
           r < 0 ? std::strerror(errno) : "the file ends early");
    got += size_t(r);
    ++reads;
    // Skip the iovecs the read filled; shorten the one it ended in.
    for (size_t left = size_t(r); left > 0 && first < iov.size();) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
}

void NeuronStore::read_bundles(Layer& L, const int32_t* neurons, const int32_t* slots, int64_t n, ThreadPool* pool) {
  if (n == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  // The runs of consecutive neurons (at most kMaxIov each: preadv's limit).
  runs_.clear();
  for (int64_t k = 0; k < n;) {
    int64_t e = k + 1;
    while (e < n && e - k < kMaxIov && neurons[e] == neurons[e - 1] + 1) ++e;
    runs_.push_back({k, e});
    k = e;
  }
  const int64_t n_runs = int64_t(runs_.size());
  int64_t reads = 0;
  if (!pool || pool->size() == 1 || n_runs < 2 * pool->size()) {
    std::vector<iovec> iov;
    for (const auto& [k, e] : runs_) read_run(L, neurons + k, slots + k, e - k, iov, reads);
  } else {
    // The pool's threads read runs side by side (reads from the page cache are copies, and a
    // disk serves several requests at once better than one after another). A worker cannot
    // throw: the first error is kept and thrown here.
    const int64_t per = (n_runs + 4 * pool->size() - 1) / (4 * pool->size());
    std::atomic<int64_t> all_reads{0};
    std::mutex err_mutex;
    std::string err;
    pool->for_chunks((n_runs + per - 1) / per, [&](int64_t c, int) {
      std::vector<iovec> iov;
      int64_t mine = 0;
      try {
        for (int64_t r = c * per; r < std::min(n_runs, (c + 1) * per); ++r)
          read_run(L, neurons + runs_[size_t(r)].first, slots + runs_[size_t(r)].first,
                   runs_[size_t(r)].second - runs_[size_t(r)].first, iov, mine);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(err_mutex);
        if (err.empty()) err = e.what();
      }
      all_reads += mine;
    });
    reads = all_reads.load();
    if (!err.empty()) throw Error(err);
  }
  stats_.reads += reads;
  stats_.bytes_read += n * L.spec.bundles.layout.bundle_bytes();
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t NeuronStore::advise(int64_t il, const int32_t* sel, int64_t n) {
  TERN_ASSERT(has_layer(il));
  const Layer& L = layer(il);
  const int64_t bb = L.spec.bundles.layout.bundle_bytes();
  int64_t asked = 0;
  for (int64_t k = 0; k < n;) {
    if (L.slot_of[size_t(sel[k])] >= 0) {
      ++k;
      continue;
    }
    int64_t e = k + 1;
    while (e < n && sel[e] == sel[e - 1] + 1 && L.slot_of[size_t(sel[e])] < 0) ++e;
    const uint64_t off = L.spec.bundles.file_offset + uint64_t(sel[k]) * uint64_t(bb);
    ::posix_fadvise(fd_, off_t(off), off_t((e - k) * bb), POSIX_FADV_WILLNEED);
    asked += (e - k) * bb;
    k = e;
  }
  stats_.advised_bytes += asked;
  return asked;
}

void NeuronStore::drop_page_cache() const { ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED); }

void NeuronStore::visit(int64_t il, const int32_t* sel, int64_t n, const PieceFn& fn, ThreadPool* pool) {
  TERN_ASSERT(has_layer(il));
  Layer& L = layer(il);
  const int64_t F = L.spec.bundles.layout.n_ff, S = L.spec.slots;
  bool first = true;
  piece_.clear();
  miss_neuron_.clear();
  miss_slot_.clear();
  ++epoch_;
  const auto flush = [&] {
    if (piece_.empty()) return;
    try {
      read_bundles(L, miss_neuron_.data(), miss_slot_.data(), int64_t(miss_neuron_.size()), pool);
    } catch (...) {
      // The slots it was reading into hold no neuron now (a later visit reads them again).
      for (size_t k = 0; k < miss_neuron_.size(); ++k) {
        L.slot_of[size_t(miss_neuron_[k])] = -1;
        L.neuron_of[size_t(miss_slot_[k])] = -1;
      }
      throw;
    }
    fn(L.slots.get(), S, piece_.data(), int64_t(piece_.size()), first);
    ++stats_.pieces;
    first = false;
    piece_.clear();
    miss_neuron_.clear();
    miss_slot_.clear();
    ++epoch_;  // every slot of the piece may be evicted now
  };
  for (int64_t k = 0; k < n; ++k) {
    const int32_t j = sel[k];
    TERN_ASSERT(j >= 0 && j < F && (k == 0 || j > sel[k - 1]));
    ++stats_.lookups;
    int32_t s = L.slot_of[size_t(j)];
    if (s >= 0) {
      ++stats_.hits;
      if (s >= L.n_hot) {
        touch(L, s);
        L.stamp[size_t(s)] = epoch_;
      }
    } else {
      // The least recently used cache slot, unless this piece uses it (then every cache slot is
      // the piece's: run it first).
      if (L.stamp[size_t(L.head)] == epoch_) flush();
      s = L.head;
      if (L.neuron_of[size_t(s)] >= 0) L.slot_of[size_t(L.neuron_of[size_t(s)])] = -1;
      L.neuron_of[size_t(s)] = j;
      L.slot_of[size_t(j)] = s;
      touch(L, s);
      L.stamp[size_t(s)] = epoch_;
      miss_neuron_.push_back(j);
      miss_slot_.push_back(s);
    }
    piece_.push_back(s);
  }
  flush();
}

}  // namespace tern
