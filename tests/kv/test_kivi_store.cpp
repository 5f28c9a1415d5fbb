// KIVI 2-bit K/V in the KvStore (issue #20; kv/kv_store.h, ops/attention_iface.h's KiviLayer):
// open groups hold the stored rows as fp16 exactly; a group is quantized when its last slot was
// written and seal_due runs, keys per channel over its 32 slots and values per token in blocks
// of 32, each value within half a step of what was stored (checked against the range computed
// here in double); a sealed slot written again reopens its group; copy_slots carries the decoded
// rows; sizes are 3 bits an element; and what it cannot store is refused with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/kv_store.h"

namespace tern::test_kivi_store {
namespace {

// Random rows of the given sizes, as the model would store them: [n_slots][row] per layer.
struct Rows {
  std::vector<std::vector<float>> k, v;  // [layer][slot * row + e]
  Rows(const std::vector<int64_t>& rows, int64_t n_slots, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t r : rows) {
      k.emplace_back(static_cast<size_t>(n_slots * r));
      v.emplace_back(static_cast<size_t>(n_slots * r));
      // Channels of different scales and offsets: per-channel key quantization's reason.
      for (int64_t s = 0; s < n_slots; ++s)
        for (int64_t e = 0; e < r; ++e) {
          k.back()[size_t(s * r + e)] = normal(rng) * float(1 + e % 5) + float(e % 7) - 3.0f;
          v.back()[size_t(s * r + e)] = normal(rng);
        }
    }
  }
};

float half_round(float x) { return fp16_to_f32(f32_to_fp16(x)); }

void store_slots(KvStore& kv, const Rows& x, int64_t s0, int64_t s1) {
  for (int64_t il = 0; il < int64_t(x.k.size()); ++il) {
    const int64_t r = kv.row(il);
    for (int64_t s = s0; s < s1; ++s)
      kv.store(il, s, 0, x.k[size_t(il)].data() + s * r, x.v[size_t(il)].data() + s * r, r);
  }
}

// Every value of a sealed group is within half a quantization step of the half it was stored
// as (plus the fp16 rounding of the step and minimum): K's step from its channel's range over
// the group's 32 slots, V's from its 32-element block's range, computed here in double.
void expect_sealed_within_half_a_step(const KvStore& kv, const Rows& x, int64_t group) {
  for (int64_t il = 0; il < int64_t(x.k.size()); ++il) {
    const int64_t r = kv.row(il);
    std::vector<float> got(static_cast<size_t>(r));
    auto bound = [](double lo, double hi) {
      const double step = (hi - lo) / 3.0;
      return 0.5 * step + 4e-3 * step + 1e-3 * std::fabs(lo) + 1e-6;
    };
    for (int64_t e = 0; e < r; ++e) {  // keys, per channel
      double lo = 1e30, hi = -1e30;
      for (int64_t j = 0; j < kKiviGroup; ++j) {
        const double h = half_round(x.k[size_t(il)][size_t((group * kKiviGroup + j) * r + e)]);
        lo = std::min(lo, h);
        hi = std::max(hi, h);
      }
      for (int64_t j = 0; j < kKiviGroup; ++j) {
        const int64_t s = group * kKiviGroup + j;
        kv.load_row(il, s, false, got.data());
        const double want = half_round(x.k[size_t(il)][size_t(s * r + e)]);
        ASSERT_LE(std::fabs(got[size_t(e)] - want), bound(lo, hi)) << "K layer " << il << " slot " << s << " e " << e;
      }
    }
    for (int64_t j = 0; j < kKiviGroup; ++j) {  // values, per token and block
      const int64_t s = group * kKiviGroup + j;
      kv.load_row(il, s, true, got.data());
      for (int64_t b = 0; b < r / 32; ++b) {
        double lo = 1e30, hi = -1e30;
        for (int64_t i = 0; i < 32; ++i) {
          lo = std::min(lo, double(half_round(x.v[size_t(il)][size_t(s * r + b * 32 + i)])));
          hi = std::max(hi, double(half_round(x.v[size_t(il)][size_t(s * r + b * 32 + i)])));
        }
        for (int64_t i = 0; i < 32; ++i) {
          const double want = half_round(x.v[size_t(il)][size_t(s * r + b * 32 + i)]);
          ASSERT_LE(std::fabs(got[size_t(b * 32 + i)] - want), bound(lo, hi)) << "V layer " << il << " slot " << s;
        }
      }
    }
  }
}

// Open groups read back the halves of what was stored, bit for bit.
void expect_open_exact(const KvStore& kv, const Rows& x, int64_t s0, int64_t s1) {
  for (int64_t il = 0; il < int64_t(x.k.size()); ++il) {
    const int64_t r = kv.row(il);
    std::vector<float> k(static_cast<size_t>(r)), v(static_cast<size_t>(r));
    for (int64_t s = s0; s < s1; ++s) {
      kv.load_row(il, s, false, k.data());
      kv.load_row(il, s, true, v.data());
      for (int64_t e = 0; e < r; ++e) {
        ASSERT_EQ(k[size_t(e)], half_round(x.k[size_t(il)][size_t(s * r + e)])) << "slot " << s;
        ASSERT_EQ(v[size_t(e)], half_round(x.v[size_t(il)][size_t(s * r + e)])) << "slot " << s;
      }
    }
  }
}

const std::vector<int64_t> kRows = {64, 128};

TEST(KiviStore, GroupsSealWhenTheirLastSlotIsWrittenAndStayWithinHalfAStep) {
  KvStore kv(kRows, 100, KvType::Kivi2);  // 4 groups, the last one partial
  EXPECT_EQ(kv.n_groups(), 4);
  const Rows x(kRows, 128, 7);
  store_slots(kv, x, 0, 45);
  // Group 0's last slot was written: due, but open until seal_due (a step attends first).
  EXPECT_EQ(kv.n_open_groups(), 2 * 2);  // groups 0 and 1, two layers
  expect_open_exact(kv, x, 0, 45);
  kv.seal_due(0);
  kv.seal_due(1);
  EXPECT_EQ(kv.n_open_groups(), 2);  // group 1 in each layer
  expect_sealed_within_half_a_step(kv, x, 0);
  expect_open_exact(kv, x, 32, 45);
  // And the sealed values are not the halves themselves (it did quantize).
  std::vector<float> got(64);
  kv.load_row(0, 3, false, got.data());
  int n_diff = 0;
  for (int64_t e = 0; e < 64; ++e) n_diff += got[size_t(e)] != half_round(x.k[0][size_t(3 * 64 + e)]);
  EXPECT_GT(n_diff, 32);
}

TEST(KiviStore, ASealedSlotWrittenAgainReopensItsGroupUntilItSealsAgain) {
  KvStore kv(kRows, 64, KvType::Kivi2);
  const Rows x(kRows, 64, 11), y(kRows, 64, 12);
  store_slots(kv, x, 0, 32);
  for (int64_t il = 0; il < 2; ++il) kv.seal_due(il);
  ASSERT_EQ(kv.n_open_groups(), 0);
  std::vector<std::vector<float>> before(32, std::vector<float>(64));
  for (int64_t s = 0; s < 32; ++s) kv.load_row(0, s, false, before[size_t(s)].data());
  // A rolled-back draft: slots 30 and 31 written again with other rows.
  store_slots(kv, y, 30, 31);
  EXPECT_EQ(kv.n_open_groups(), 2);
  expect_open_exact(kv, y, 30, 31);
  std::vector<float> got(64);
  for (int64_t s = 0; s < 30; ++s) {  // the others read their decoded values (as halves)
    kv.load_row(0, s, false, got.data());
    for (int64_t e = 0; e < 64; ++e) ASSERT_EQ(got[size_t(e)], half_round(before[size_t(s)][size_t(e)])) << s;
  }
  store_slots(kv, y, 31, 32);
  for (int64_t il = 0; il < 2; ++il) kv.seal_due(il);
  EXPECT_EQ(kv.n_open_groups(), 0);
}

TEST(KiviStore, CopySlotsCarriesTheDecodedRows) {
  KvStore kv(kRows, 96, KvType::Kivi2);
  const Rows x(kRows, 96, 5);
  store_slots(kv, x, 0, 40);
  for (int64_t il = 0; il < 2; ++il) kv.seal_due(il);
  kv.copy_slots(0, 64, 32);  // a sealed group into an empty one: it seals there too
  kv.copy_slots(32, 0, 8);   // an open group's rows into the sealed group 0: reopened
  EXPECT_EQ(kv.n_open_groups(), 2 * 2);  // groups 0 and 1
  for (int64_t il = 0; il < 2; ++il) {
    const int64_t r = kv.row(il);
    std::vector<float> a(static_cast<size_t>(r)), b(static_cast<size_t>(r));
    for (int64_t s = 0; s < 8; ++s)
      for (bool is_v : {false, true}) {
        kv.load_row(il, 32 + s, is_v, a.data());
        kv.load_row(il, s, is_v, b.data());
        for (int64_t e = 0; e < r; ++e) ASSERT_EQ(a[size_t(e)], b[size_t(e)]);
      }
    // Requantizing values that lie on one grid: within a step of the copied group's own.
    for (int64_t s = 0; s < 32; ++s) {
      kv.load_row(il, 64 + s, true, a.data());
      for (int64_t e = 0; e < r; ++e)
        ASSERT_NEAR(a[size_t(e)], x.v[size_t(il)][size_t(s * r + e)], 1.5) << "layer " << il << " slot " << s;
    }
  }
}

TEST(KiviStore, KAndVTakeThreeBitsAnElement) {
  EXPECT_EQ(kv_row_bytes(KvType::Kivi2, 256), 96);
  EXPECT_EQ(KvStore::bytes_per_token(kRows, KvType::Kivi2) * 16, KvStore::bytes_per_token(kRows, KvType::F16) * 3);
  KvStore kv(kRows, 64, KvType::Kivi2);
  // Sealed arrays (3 bits an element) and the groups' stage indices; no stage yet.
  EXPECT_EQ(kv.bytes(), 64 * KvStore::bytes_per_token(kRows, KvType::Kivi2) + 2 * 2 * 4);
  const Rows x(kRows, 64, 3);
  store_slots(kv, x, 0, 1);
  EXPECT_GT(kv.bytes(), 64 * KvStore::bytes_per_token(kRows, KvType::Kivi2) + 2 * 2 * 4);  // an open group's stage
}

// A sealed group's stage buffer serves the next layer: the groups one step completes need one
// layer's stages at a time (each layer seals its groups after its attention).
TEST(KiviStore, ASealedStageServesTheNextLayer) {
  const std::vector<int64_t> rows = {64, 64};
  KvStore kv(rows, 64, KvType::Kivi2);
  const Rows x(rows, 64, 9);
  const int64_t sealed_bytes = kv.bytes();
  for (int64_t s = 0; s < 32; ++s) kv.store(0, s, 0, x.k[0].data() + s * 64, x.v[0].data() + s * 64, 64);
  const int64_t one_stage = kv.bytes() - sealed_bytes;
  EXPECT_EQ(one_stage, 2 * 32 * 64 * 2);
  kv.seal_due(0);
  EXPECT_EQ(kv.bytes(), sealed_bytes + one_stage);  // kept as a spare
  for (int64_t s = 0; s < 32; ++s) kv.store(1, s, 0, x.k[1].data() + s * 64, x.v[1].data() + s * 64, 64);
  EXPECT_EQ(kv.bytes(), sealed_bytes + one_stage);  // layer 1 took it
  kv.seal_due(1);
  expect_sealed_within_half_a_step(kv, x, 0);
  EXPECT_EQ(kv.n_open_groups(), 0);
}

TEST(KiviStore, WhatItCannotStoreIsRefusedWithTheReason) {
  try {
    check_kv_type(KvType::Kivi2, std::vector<int64_t>{48}, 16, "model 'x'");
    ADD_FAILURE() << "kivi2 took a row of 48";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("48 elements"), std::string::npos) << e.what();
  }
  try {
    check_kv_type(KvType::Kivi2, std::vector<int64_t>{40}, 20, "model 'x'");
    ADD_FAILURE() << "kivi2 took a head of 20";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim is 20"), std::string::npos) << e.what();
  }
  try {
    KvStore kv(std::vector<int64_t>{64}, 32, KvType::Kivi2, /*k_only=*/true);
    ADD_FAILURE() << "kivi2 took a latent cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("latent"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv_type_from_name("kivi2"), KvType::Kivi2);
}

}  // namespace
}  // namespace tern::test_kivi_store
