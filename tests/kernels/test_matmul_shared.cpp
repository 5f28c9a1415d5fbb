// matmul_shared_input (q/k/v or gate/up over one input) gives exactly the bits of separate
// matmul calls, for every variant, mixed weight types (shared activation format or not: the
// fallback), decode and prefill token counts, and uneven thread counts; with its RMSNorm
// prologue, exactly the bits of rms_norm followed by the matmul.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

struct Stored {
  DType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> data;
  WeightView view() const { return {type, n_in, n_out, data.data()}; }
};

Stored make(DType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Stored s{type, n_in, n_out, std::vector<uint8_t>(size_t(dtype_row_bytes(type, n_in) * n_out))};
  std::vector<float> row(static_cast<size_t>(n_in));
  const QuantTraits& q = *quant_traits(type);
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : row) v = dist(rng);
    q.from_float(row.data(), s.data.data() + r * dtype_row_bytes(type, n_in), n_in);
  }
  return s;
}

TEST(MatmulSharedInput, EqualsSeparateMatmulsBitForBit) {
  const int64_t n_in = 512;
  const std::vector<std::vector<DType>> groups = {
      {DType::Q4_0, DType::Q4_0, DType::Q4_0}, {DType::Q4_0, DType::Q8_0}, {DType::Q4_K, DType::Q6_K},
      {DType::Q4_0, DType::Q6_K, DType::F16},  {DType::F16, DType::F32},   {DType::Q8_0}};
  const int64_t n_outs[] = {96, 36, 13};  // ragged: not a multiple of the row tiles
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (Isa isa : kAllIsas) {
    if (!isa_supported(isa)) continue;
    for (int n_threads : {1, 2, 3}) {
      ThreadPool pool(n_threads);
      for (const auto& types : groups) {
        std::vector<Stored> ws;
        for (size_t k = 0; k < types.size(); ++k) ws.push_back(make(types[k], n_in, n_outs[k % 3], uint32_t(17 + k)));
        for (int64_t n_tokens : {1, 3, 16, 37}) {
          const int64_t ldx = n_in + 5;
          std::vector<float> x(size_t(n_tokens * ldx));
          for (auto& v : x) v = dist(rng);
          std::vector<std::vector<float>> y_sep, y_shared;
          std::vector<MatmulTarget> targets;
          for (const auto& w : ws) {
            y_sep.emplace_back(size_t(n_tokens * (w.n_out + 2)), 0.0f);
            y_shared.emplace_back(size_t(n_tokens * (w.n_out + 2)), 0.0f);
          }
          for (size_t k = 0; k < ws.size(); ++k) {
            matmul_isa(isa, ws[k].view(), x.data(), ldx, n_tokens, y_sep[k].data(), ws[k].n_out + 2, pool);
            targets.push_back(MatmulTarget{ws[k].view(), y_shared[k].data(), ws[k].n_out + 2});
          }
          matmul_shared_input_isa(isa, targets, x.data(), ldx, n_tokens, pool);
          for (size_t k = 0; k < ws.size(); ++k)
            ASSERT_EQ(0, std::memcmp(y_sep[k].data(), y_shared[k].data(), y_sep[k].size() * sizeof(float)))
                << isa_name(isa) << " threads " << n_threads << " tokens " << n_tokens << " weight " << k << " ("
                << dtype_name(ws[k].type) << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// The epilogue sees each target's rows exactly once, already final, in chunks starting at
// multiples of 4; in joint mode every target's rows of the chunk (of its group, with joint
// groups) are final at the call.
struct Seen {
  std::vector<const std::vector<float>*> expect;  // separate matmul results per target
  std::vector<MatmulTarget> targets;
  std::vector<std::vector<std::atomic<int>>> hits;
  std::atomic<int> bad{0};
  size_t group = 1;  // RowsDone::joint_group: `target` names a group of this many targets
};

void record(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1) {
  auto* s = static_cast<Seen*>(const_cast<void*>(ctx));
  if (r0 % 4 != 0) s->bad.fetch_add(1);
  for (size_t k = 0; k < s->targets.size(); ++k) {
    if (target >= 0 && size_t(target) != k / s->group) continue;
    const MatmulTarget& t = s->targets[k];
    for (int64_t r = r0; r < r1; ++r) {
      s->hits[k][size_t(r)].fetch_add(1);
      for (int64_t tok = 0; tok < n_tokens; ++tok)
        if (t.y[tok * t.ldy + r] != (*s->expect[k])[size_t(tok * t.ldy + r)]) s->bad.fetch_add(1);
    }
  }
}

TEST(MatmulSharedInput, EpilogueSeesEveryFinishedRowOnce) {
  const int64_t n_in = 256;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    // Separate targets, joint rows of all, joint groups of two (a decode token's experts).
    for (int mode : {0, 1, 2}) {
      const bool joint = mode > 0;
      const int joint_group = mode == 2 ? 2 : 0;
      // Shared path (same activation format) and the fallback (different formats).
      for (auto types : {std::vector<DType>{DType::Q4_0, DType::Q8_0}, std::vector<DType>{DType::Q4_0, DType::F16}}) {
        if (joint_group > 0) types.insert(types.end(), {DType::Q8_0, DType::Q4_0});  // two groups of two
        std::vector<Stored> ws;
        for (size_t k = 0; k < types.size(); ++k) ws.push_back(make(types[k], n_in, joint ? 172 : int64_t(60 + 52 * k), uint32_t(3 + k)));
        for (int64_t n_tokens : {1, 16}) {
          std::vector<float> x(size_t(n_tokens * n_in));
          for (auto& v : x) v = dist(rng);
          std::vector<std::vector<float>> y_sep, y_shared;
          Seen seen;
          seen.group = joint_group > 0 ? size_t(joint_group) : 1;
          for (const auto& w : ws) {
            y_sep.emplace_back(size_t(n_tokens * w.n_out), 0.0f);
            y_shared.emplace_back(size_t(n_tokens * w.n_out), 0.0f);
          }
          for (size_t k = 0; k < ws.size(); ++k) {
            matmul(ws[k].view(), x.data(), n_in, n_tokens, y_sep[k].data(), ws[k].n_out, pool);
            seen.targets.push_back(MatmulTarget{ws[k].view(), y_shared[k].data(), ws[k].n_out});
            seen.expect.push_back(&y_sep[k]);
            seen.hits.emplace_back(size_t(ws[k].n_out));
          }
          matmul_shared_input(seen.targets, x.data(), n_in, n_tokens, pool, RowsDone{record, &seen, joint, joint_group});
          EXPECT_EQ(seen.bad.load(), 0) << "rows not final at the call, or a chunk not 4-aligned";
          for (size_t k = 0; k < ws.size(); ++k)
            for (int64_t r = 0; r < ws[k].n_out; ++r)
              ASSERT_EQ(seen.hits[k][size_t(r)].load(), 1) << "target " << k << " row " << r << " mode " << mode;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tern


namespace tern {
namespace {

// The RMSNorm prologue (InputRmsNorm) gives exactly the bits of rms_norm followed by
// matmul_shared_input on its output: the outputs and the normalised rows it hands back, for
// every variant, on the shared path (one activation format: Q8_0 rows/lanes, Q8_K rows/lanes,
// float) and the fallback (mixed formats), with rows ldx > n_in apart, in place or not, token
// counts across the single-threaded quantize (< 8), the 16-token lanes and their tails.
TEST(MatmulSharedInput, RmsNormPrologueEqualsRmsNormThenMatmulBitForBit) {
  struct Group {
    std::vector<DType> types;
    std::vector<int64_t> n_ins;  // ragged where the block size allows
  };
  const std::vector<Group> groups = {
      {{DType::Q4_0, DType::Q4_0, DType::Q4_0}, {512, 160}},
      {{DType::Q8_0}, {512, 96}},
      {{DType::Q4_K, DType::Q6_K}, {512, 256}},
      {{DType::Q6_K}, {768}},
      {{DType::F16, DType::F32}, {512, 300, 61}},
      {{DType::F32}, {257}},
      {{DType::Q4_0, DType::Q6_K, DType::F16}, {512}},  // no common format: the fallback
  };
  const int64_t n_outs[] = {68, 36, 13};
  const float eps = 1e-5f;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (Isa isa : kAllIsas) {
    if (!isa_supported(isa)) continue;
    for (int n_threads : {1, 2}) {
      ThreadPool pool(n_threads);
      for (const Group& grp : groups) {
        for (int64_t n_in : grp.n_ins) {
          std::vector<Stored> ws;
          for (size_t k = 0; k < grp.types.size(); ++k)
            ws.push_back(make(grp.types[k], n_in, n_outs[k % 3], uint32_t(41 + k)));
          std::vector<float> norm_w(static_cast<size_t>(n_in));
          for (auto& v : norm_w) v = 1.0f + 0.3f * dist(rng);
          for (int64_t n_tokens : {1, 3, 8, 16, 17, 40}) {
            for (bool in_place : {false, true}) {
              const int64_t ldx = n_in + 3;
              std::vector<float> x(size_t(n_tokens * ldx));
              for (int64_t t = 0; t < n_tokens; ++t) {
                const float mag = 0.05f + 4.0f * float(t % 5);  // rows of different scales
                for (int64_t i = 0; i < ldx; ++i) x[size_t(t * ldx + i)] = mag * dist(rng);
              }
              // Reference: ops' rms_norm (row by row: its rows are n floats apart), then the matmul.
              std::vector<float> xn_ref(x.size(), 0.0f);
              for (int64_t t = 0; t < n_tokens; ++t)
                rms_norm(x.data() + t * ldx, norm_w.data(), xn_ref.data() + t * ldx, 1, n_in, eps, pool);
              std::vector<std::vector<float>> y_ref, y_fused;
              std::vector<MatmulTarget> t_ref, t_fused;
              for (const auto& w : ws) {
                y_ref.emplace_back(size_t(n_tokens * (w.n_out + 1)), 0.0f);
                y_fused.emplace_back(size_t(n_tokens * (w.n_out + 1)), 0.0f);
              }
              for (size_t k = 0; k < ws.size(); ++k) {
                t_ref.push_back(MatmulTarget{ws[k].view(), y_ref[k].data(), ws[k].n_out + 1});
                t_fused.push_back(MatmulTarget{ws[k].view(), y_fused[k].data(), ws[k].n_out + 1});
              }
              matmul_shared_input_isa(isa, t_ref, xn_ref.data(), ldx, n_tokens, pool);

              std::vector<float> x_in = x;
              std::vector<float> xn(x.size(), 0.0f);
              float* out_rows = in_place ? x_in.data() : xn.data();
              matmul_shared_input_isa(isa, t_fused, x_in.data(), ldx, n_tokens, pool, RowsDone{},
                                      InputRmsNorm{norm_w.data(), eps, out_rows});
              const std::string where = std::string(isa_name(isa)) + " threads " + std::to_string(n_threads) +
                                        " n_in " + std::to_string(n_in) + " tokens " + std::to_string(n_tokens) +
                                        (in_place ? " in place" : "");
              for (int64_t t = 0; t < n_tokens; ++t)
                ASSERT_EQ(0, std::memcmp(xn_ref.data() + t * ldx, out_rows + t * ldx, size_t(n_in) * sizeof(float)))
                    << "normalised row " << t << ", " << where;
              if (!in_place) {
                ASSERT_EQ(0, std::memcmp(x.data(), x_in.data(), x.size() * sizeof(float))) << "x modified, " << where;
              }
              for (size_t k = 0; k < ws.size(); ++k)
                ASSERT_EQ(0, std::memcmp(y_ref[k].data(), y_fused[k].data(), y_ref[k].size() * sizeof(float)))
                    << where << " weight " << k << " (" << dtype_name(ws[k].type) << ")";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tern
