// The neuron store under --ram-budget (models/neuron_store.h), on a file of known bundles
// without a model: the hot neurons are the most frequent and cost no read; every piece hands
// the kernel slots holding exactly the file's bundles of the selection, in its order; a
// selection larger than the cache runs in pieces of at most the cache's size; the cache is
// least-recently-used; runs of consecutive missing neurons are one read; a file that ends early
// is a clear error naming it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/neuron_store.h"
#include "test_util.h"
#include "train/train_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_neuron_store {
namespace {

using tern::testing::error_of;

constexpr int64_t kFf = 40;
constexpr int64_t kHeader = 100;  // bytes before the bundles (a GGUF's header and tensor table)

// One layer of n_ff bundles of 24 bytes (F32 rows of 2: gate 8, up 8, down_t 8), byte b of
// neuron j's bundle = (7 j + b) mod 251 (every bundle distinct), after kHeader bytes.
FfnBundleLayout layout() {
  FfnBundleLayout l;
  l.type = DType::F32;
  l.down_t_type = DType::F32;
  l.n_embd = 2;
  l.n_ff = kFf;
  l.gate_up_bytes = 8;
  l.down_t_bytes = 8;
  return l;
}

uint8_t byte_of(int64_t j, int64_t b) { return uint8_t((7 * j + b) % 251); }

class NeuronStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("bundles.bin");
    std::vector<uint8_t> bytes(size_t(kHeader + kFf * layout().bundle_bytes()), 0xee);
    for (int64_t j = 0; j < kFf; ++j)
      for (int64_t b = 0; b < layout().bundle_bytes(); ++b)
        bytes[size_t(kHeader + j * layout().bundle_bytes() + b)] = byte_of(j, b);
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    // Frequencies: neurons 30..39 the most frequent (39 first), the rest by index.
    freq_.resize(size_t(kFf));
    for (int64_t j = 0; j < kFf; ++j) freq_[size_t(j)] = j >= 30 ? float(j) : 0.01f * float(kFf - j);
  }
  NeuronStoreLayer spec(int64_t slots, int64_t cache) const {
    NeuronStoreLayer s;
    s.il = 3;
    s.bundles.layout = layout();
    s.bundles.file_offset = kHeader;
    s.freq = freq_.data();
    s.slots = slots;
    s.cache_slots = cache;
    return s;
  }
  // Visits sel and checks each piece's slots hold the selection's bundles in order; returns the
  // pieces' sizes.
  std::vector<int64_t> visit_checked(NeuronStore& st, const std::vector<int32_t>& sel) {
    std::vector<int64_t> sizes;
    size_t k = 0;
    st.visit(3, sel.data(), int64_t(sel.size()),
             [&](const uint8_t* base, int64_t n_slots, const int32_t* slot_idx, int64_t n, bool first) {
               EXPECT_EQ(first, sizes.empty());
               sizes.push_back(n);
               for (int64_t i = 0; i < n; ++i, ++k) {
                 EXPECT_GE(slot_idx[i], 0);
                 EXPECT_LT(slot_idx[i], n_slots);
                 const uint8_t* row = base + int64_t(slot_idx[i]) * layout().bundle_bytes();
                 for (int64_t b = 0; b < layout().bundle_bytes(); ++b)
                   ASSERT_EQ(row[b], byte_of(sel[k], b)) << "neuron " << sel[k] << " byte " << b;
               }
             });
    EXPECT_EQ(k, sel.size());
    return sizes;
  }

  tern::testing::TrainTempDir dir_;
  std::string path_;
  std::vector<float> freq_;
};

TEST_F(NeuronStoreTest, HotNeuronsAreTheMostFrequentAndCostNoRead) {
  NeuronStore st(path_, {spec(/*slots=*/14, /*cache=*/4)});  // 10 hot: neurons 30..39
  EXPECT_EQ(st.hot_neurons(), 10);
  EXPECT_EQ(st.cache_neurons(), 4);
  EXPECT_EQ(st.resident_bytes(), 14 * layout().bundle_bytes());
  EXPECT_EQ(st.stats().bytes_read, 0);  // the load's reads are not counted
  std::vector<int32_t> hot(10);
  std::iota(hot.begin(), hot.end(), 30);
  EXPECT_EQ(visit_checked(st, hot), std::vector<int64_t>{10});
  EXPECT_EQ(st.stats().bytes_read, 0);
  EXPECT_EQ(st.stats().hits, 10);
  // Ties in frequency go to the lower index: with 11 hot, neuron 0 (0.4) joins.
  NeuronStore st2(path_, {spec(15, 4)});
  EXPECT_EQ(visit_checked(st2, {0}), std::vector<int64_t>{1});
  EXPECT_EQ(st2.stats().bytes_read, 0);
}

TEST_F(NeuronStoreTest, ColdNeuronsAreReadIntoAnLruCacheOneReadPerRun) {
  NeuronStore st(path_, {spec(14, 4)});
  // 4 cold neurons in two runs (2, 3) and (10, 11): two reads, then all hits.
  EXPECT_EQ(visit_checked(st, {2, 3, 10, 11, 35}), std::vector<int64_t>{5});
  EXPECT_EQ(st.stats().reads, 2);
  EXPECT_EQ(st.stats().bytes_read, 4 * layout().bundle_bytes());
  EXPECT_EQ(st.stats().hits, 1);
  visit_checked(st, {2, 3, 10, 11});
  EXPECT_EQ(st.stats().reads, 2);
  EXPECT_EQ(st.stats().hits, 5);
  // Touch 2 and 3, then two new neurons evict the least recently used (10 and 11).
  visit_checked(st, {2, 3});
  visit_checked(st, {20, 21});
  EXPECT_EQ(st.stats().reads, 3);
  const int64_t hits = st.stats().hits;
  visit_checked(st, {2, 3, 20, 21});
  EXPECT_EQ(st.stats().hits, hits + 4);
  visit_checked(st, {10});
  EXPECT_EQ(st.stats().hits, hits + 4);  // 10 was evicted: read again
  EXPECT_EQ(st.stats().reads, 4);
}

TEST_F(NeuronStoreTest, ASelectionLargerThanTheCacheRunsInPieces) {
  NeuronStore st(path_, {spec(14, 4)});
  std::vector<int32_t> sel;
  for (int32_t j = 0; j < 30; j += 2) sel.push_back(j);  // 15 cold neurons, a cache of 4
  sel.push_back(31);                                      // and a hot one
  const std::vector<int64_t> sizes = visit_checked(st, sel);
  ASSERT_EQ(sizes.size(), 4u);
  EXPECT_EQ(sizes[0], 4);
  EXPECT_EQ(sizes[3], 4);  // 28, then 31 (hot) joins the last piece
  EXPECT_EQ(st.stats().pieces, 4);
  EXPECT_EQ(st.stats().bytes_read, 15 * layout().bundle_bytes());
  // A pool's threads reading the runs side by side: the same slots' bytes, pieces and reads.
  ThreadPool pool(2);
  NeuronStore par(path_, {spec(14, 4)});
  std::vector<int32_t> cold;
  for (int32_t j = 0; j < 4; ++j) cold.push_back(j * 3);  // four runs of one
  std::vector<int64_t> par_sizes;
  size_t k = 0;
  par.visit(3, cold.data(), int64_t(cold.size()),
            [&](const uint8_t* base, int64_t, const int32_t* slot_idx, int64_t n, bool) {
              par_sizes.push_back(n);
              for (int64_t i = 0; i < n; ++i, ++k)
                for (int64_t b = 0; b < layout().bundle_bytes(); ++b)
                  ASSERT_EQ(base[int64_t(slot_idx[i]) * layout().bundle_bytes() + b], byte_of(cold[k], b));
            },
            &pool);
  EXPECT_EQ(par_sizes, std::vector<int64_t>{4});
  EXPECT_EQ(par.stats().reads, 4);
  EXPECT_EQ(par.stats().bytes_read, 4 * layout().bundle_bytes());
  // Everything resident: one piece, no reads after the load.
  NeuronStore all(path_, {spec(kFf, 0)});
  std::vector<int32_t> every(static_cast<size_t>(kFf));
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(visit_checked(all, every), std::vector<int64_t>{kFf});
  EXPECT_EQ(all.stats().bytes_read, 0);
}

TEST_F(NeuronStoreTest, ClearErrors) {
  // Slot counts that do not fit: more slots than neurons; no cache while some neurons are cold.
  EXPECT_NE(error_of([&] { NeuronStore st(path_, {spec(kFf + 1, 4)}); }).find("do not fit"), std::string::npos);
  EXPECT_NE(error_of([&] { NeuronStore st(path_, {spec(14, 0)}); }).find("do not fit"), std::string::npos);
  // A file that ends inside the hot neurons' bundles: the read names the file.
  std::filesystem::resize_file(path_, uint64_t(kHeader + 32 * layout().bundle_bytes() + 5));
  const std::string e = error_of([&] { NeuronStore st(path_, {spec(14, 4)}); });
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  EXPECT_NE(e.find("ends early"), std::string::npos) << e;
  // A cold read past the end, at a visit (the hot neurons 30..39 read before the cut).
  std::filesystem::resize_file(path_, uint64_t(kHeader + kFf * layout().bundle_bytes()));
  NeuronStore st(path_, {spec(14, 4)});
  std::filesystem::resize_file(path_, uint64_t(kHeader + 10 * layout().bundle_bytes()));
  const int32_t far = 20;
  const std::string cold = error_of([&] { st.visit(3, &far, 1, [](const uint8_t*, int64_t, const int32_t*, int64_t, bool) {}); });
  EXPECT_NE(cold.find("layer 3"), std::string::npos) << cold;
  EXPECT_NE(cold.find("ends early"), std::string::npos) << cold;
  const std::string missing = error_of([&] { NeuronStore s2(dir_.file("nope.bin"), {spec(14, 4)}); });
  EXPECT_NE(missing.find("nope.bin"), std::string::npos) << missing;
}

}  // namespace
}  // namespace tern::test_neuron_store
