#pragma once
// Hot / cold neurons under a memory budget (issue #31, docs/sparsity.md "Models larger than
// memory"; PowerInfer's hot / cold split, LLM in a flash's bundles and row cache): per dense
// ReGLU layer, a fixed number of slots, each holding one neuron's bundle (models/
// ffn_bundle_format.h: its gate, up and down_t rows). The layer's most frequently active neurons
// (the predictor's calibration frequencies) are read into the first slots once and stay ("hot");
// the other slots are an LRU cache of "cold" neurons read from the model file when a token
// selects them (one preadv per run of consecutive neurons: their bundles are adjacent in the
// file). The FFN weights in memory are then the slots alone, whatever the model's size.
//
// visit() hands a token's selection to the kernel in pieces whose bundles are all in slots: a
// selection larger than the free cache runs in several pieces, each added into the FFN's output
// in order (sparse_ffn_reglu's accumulate), which gives the bits of one run over it all.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/uio.h>

#include <utility>

#include "core/huge_buffer.h"
#include "core/thread_pool.h"
#include "models/ffn_bundle_format.h"

namespace tern {

struct NeuronStoreLayer {
  int64_t il = 0;
  FfnBundleTensor bundles;
  const float* freq = nullptr;  // [n_ff] activation frequencies (which neurons are hot)
  int64_t slots = 0;            // bundles it may hold: hot + cache (<= n_ff)
  int64_t cache_slots = 0;      // of which the LRU cache (>= 1 unless slots == n_ff)
};

// Counts since construction or reset_stats().
struct NeuronStoreStats {
  int64_t lookups = 0;     // selected neurons looked up
  int64_t hits = 0;        // of which already in a slot (hot or cached)
  int64_t reads = 0;       // preadv calls
  int64_t bytes_read = 0;  // bytes they read from the file
  int64_t pieces = 0;      // kernel calls (more than one a visit when the cache was too small)
  int64_t advised_bytes = 0;  // readahead asked for (advise)
  double read_seconds = 0;
  double hit_rate() const { return lookups > 0 ? double(hits) / double(lookups) : 0.0; }
};

class NeuronStore {
 public:
  // Opens `path` (the model file the bundles are in) and reads each layer's hot neurons (the
  // `slots - cache_slots` most frequent, ties to the lower index) into its slots. Throws
  // tern::Error naming the file on a read error or a short file.
  NeuronStore(const std::string& path, std::vector<NeuronStoreLayer> layers);
  ~NeuronStore();
  NeuronStore(const NeuronStore&) = delete;
  NeuronStore& operator=(const NeuronStore&) = delete;

  bool has_layer(int64_t il) const { return il >= 0 && il < int64_t(index_.size()) && index_[size_t(il)] >= 0; }
  const FfnBundleLayout& layout(int64_t il) const { return layer(il).spec.bundles.layout; }

  // What the kernel gets for one piece: the layer's slot memory [slots][bundle_bytes] and the
  // slots of the piece's neurons, in the selection's order; `first`: the piece that starts the
  // visit (the kernel overwrites y), later pieces add to it.
  using PieceFn = std::function<void(const uint8_t* slot_base, int64_t n_slots, const int32_t* slot_idx, int64_t n,
                                     bool first)>;
  // Runs `fn` over the neurons sel[0 .. n) of layer il (ascending, each in [0, n_ff)), reading
  // the missing ones from the file (with `pool`, its threads read runs side by side; called from
  // the thread that owns it). Calls fn at least once when n > 0, never when n == 0.
  void visit(int64_t il, const int32_t* sel, int64_t n, const PieceFn& fn, ThreadPool* pool = nullptr);

  // Readahead (--ram-readahead): asks the kernel to start reading the bundles of the neurons
  // sel[0 .. n) of layer il (ascending) that are in no slot (posix_fadvise WILLNEED, one call a
  // run of consecutive ones), so that a later visit finds them in the page cache. Returns the
  // bytes asked for.
  int64_t advise(int64_t il, const int32_t* sel, int64_t n);
  // Drops the file's pages from the page cache (posix_fadvise DONTNEED): the next reads come
  // from the disk (tern bench --cold-file). Pages another process maps stay.
  void drop_page_cache() const;

  // Bytes of the slots (every layer's), what the budget paid for.
  int64_t resident_bytes() const;
  int64_t hot_neurons() const;
  int64_t cache_neurons() const;
  const NeuronStoreStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  const std::string& path() const { return path_; }

 private:
  struct Layer {
    NeuronStoreLayer spec;
    HugeBuffer slots;               // [spec.slots][bundle_bytes]
    std::vector<int32_t> slot_of;   // [n_ff] -1: not in a slot
    std::vector<int32_t> neuron_of; // [slots] -1: empty
    // The cache slots [n_hot, slots) as a list, least recently used first.
    std::vector<int32_t> prev, next, stamp;  // [slots]
    int32_t head = -1, tail = -1;
    int64_t n_hot = 0;
  };
  void load(std::vector<NeuronStoreLayer> layers);  // the constructor's checks and hot reads
  Layer& layer(int64_t il) { return layers_[size_t(index_[size_t(il)])]; }
  const Layer& layer(int64_t il) const { return layers_[size_t(index_[size_t(il)])]; }
  void touch(Layer& L, int32_t s);
  // Reads neurons[k] into slots[k] (ascending neurons): one preadv per run of consecutive ones.
  void read_bundles(Layer& L, const int32_t* neurons, const int32_t* slots, int64_t n, ThreadPool* pool);
  void read_run(const Layer& L, const int32_t* neurons, const int32_t* slots, int64_t n, std::vector<iovec>& iov,
                int64_t& reads) const;

  std::string path_;
  int fd_ = -1;
  std::vector<Layer> layers_;
  std::vector<int32_t> index_;  // [il] -> layers_, -1 for a layer it does not hold
  int32_t epoch_ = 0;           // one per piece: a slot stamped with it is in use
  std::vector<int32_t> piece_, miss_neuron_, miss_slot_;
  std::vector<std::pair<int64_t, int64_t>> runs_;  // read_bundles' runs [k, e) of consecutive neurons
  NeuronStoreStats stats_;
};

}  // namespace tern
