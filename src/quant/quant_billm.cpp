#include "quant/quant_billm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace tern {
namespace {

// (Prefixed names: this file shares a unity source with quant_tern.cpp's helpers.)
float billm_round_f16(float x) { return fp16_to_f32(f32_to_fp16(x)); }
uint16_t billm_load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

bool is_billm(DType t) { return t == DType::BILLM_G64 || t == DType::BILLM_G128; }

BillmFormat billm_format(DType t) {
  switch (t) {
    case DType::BILLM_G64: return {64};
    case DType::BILLM_G128: return {128};
    default: fail("billm_format: ", dtype_name(t), " is not a billm type");
  }
}

std::optional<DType> billm_type(int group) {
  if (group == 64) return DType::BILLM_G64;
  if (group == 128) return DType::BILLM_G128;
  return std::nullopt;
}

void billm_pack_block(BillmFormat f, const BillmBlock& b, uint8_t* dst) {
  const int g = f.group;
  TERN_ASSERT(b.n_salient >= 0 && b.n_salient <= f.slots());
  std::memset(dst, 0, size_t(f.block_bytes()));
  uint8_t* sgn = dst;
  uint8_t* sel = dst + g / 8;
  for (int j = 0; j < g; ++j) {
    sgn[j / 8] |= uint8_t((b.sgn[j] & 1) << (j % 8));
    sel[j / 8] |= uint8_t((b.sel[j] & 1) << (j % 8));
  }
  uint8_t* mags = dst + g / 4;
  const float m[4] = {b.a_c, b.a_s, b.a_1, b.a_2};
  for (int i = 0; i < 4; ++i) {
    const uint16_t h = f32_to_fp16(m[i]);
    std::memcpy(mags + 2 * i, &h, 2);
  }
  uint8_t* idx = mags + 8;
  for (int i = 0; i < f.slots(); ++i) idx[i] = i < b.n_salient ? b.salient[i] : kBillmNoColumn;
}

void billm_unpack_block(BillmFormat f, const uint8_t* src, BillmBlock* b) {
  const int g = f.group;
  for (int j = 0; j < g; ++j) {
    b->sgn[j] = (src[j / 8] >> (j % 8)) & 1;
    b->sel[j] = (src[g / 8 + j / 8] >> (j % 8)) & 1;
  }
  const uint8_t* mags = src + g / 4;
  b->a_c = fp16_to_f32(billm_load_u16(mags));
  b->a_s = fp16_to_f32(billm_load_u16(mags + 2));
  b->a_1 = fp16_to_f32(billm_load_u16(mags + 4));
  b->a_2 = fp16_to_f32(billm_load_u16(mags + 6));
  const uint8_t* idx = mags + 8;
  b->n_salient = 0;
  for (int i = 0; i < f.slots() && idx[i] != kBillmNoColumn; ++i) b->salient[b->n_salient++] = idx[i];
}

void billm_block_values(BillmFormat f, const BillmBlock& b, float* dst) {
  for (int j = 0; j < f.group; ++j) {
    const float s = b.sgn[j] ? -1.0f : 1.0f;
    dst[j] = s * (b.sel[j] ? b.a_s : b.a_c);
  }
  for (int i = 0; i < b.n_salient; ++i) {
    const int j = b.salient[i];
    if (j >= f.group) continue;  // a corrupt index (the loader refuses such files): no write outside
    dst[j] = (b.sgn[j] ? -b.a_1 : b.a_1) + (b.sel[j] ? -b.a_2 : b.a_2);
  }
}

const char* billm_block_defect(BillmFormat f, const uint8_t* src) {
  const uint8_t* mags = src + f.group / 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t h = billm_load_u16(mags + 2 * i);
    if ((h & 0x7C00u) == 0x7C00u) return "a non-finite magnitude (NaN or Inf)";
    if ((h & 0x8000u) && (h & 0x7FFFu)) return "a negative magnitude";
  }
  const uint8_t* idx = mags + 8;
  bool ended = false;
  int prev = -1;
  for (int i = 0; i < f.slots(); ++i) {
    if (idx[i] == kBillmNoColumn) {
      ended = true;
      continue;
    }
    if (ended) return "a salient column after an unused slot";
    if (idx[i] >= f.group) return "a salient column index beyond the block";
    if (int(idx[i]) <= prev) return "salient columns out of ascending order";
    prev = idx[i];
  }
  return nullptr;
}

// ---- binarizers ---------------------------------------------------------------------------

ResidualBinarization residual_binarize(const float* w, int64_t n) {
  ResidualBinarization r;
  if (n <= 0) return r;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::fabs(w[i]);
  r.a_1 = billm_round_f16(float(s / double(n)));
  // |w - a_1 sign(w)| = ||w| - a_1|: the residual's magnitude.
  double s2 = 0;
  for (int64_t i = 0; i < n; ++i) s2 += std::fabs(std::fabs(w[i]) - r.a_1);
  r.a_2 = billm_round_f16(float(s2 / double(n)));
  return r;
}

SplitBinarization split_binarize(const float* w, int64_t n) {
  SplitBinarization r;
  if (n <= 0) return r;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::fabs(w[i]);
  std::sort(v.begin(), v.end());
  double total = 0, total_sq = 0;
  for (float x : v) {
    total += x;
    total_sq += double(x) * x;
  }
  // With m values in the concentrated group (prefix sum s) and group means as magnitudes, the
  // squared error is sum v^2 - s^2/m - (T - s)^2/(n - m): maximize the two last terms.
  double best_gain = total * total / double(n);  // no split (m = n)
  int64_t best_m = n;
  double s = 0;
  for (int64_t m = 1; m < n; ++m) {
    s += v[size_t(m - 1)];
    const double gain = s * s / double(m) + (total - s) * (total - s) / double(n - m);
    if (gain > best_gain) {
      best_gain = gain;
      best_m = m;
    }
  }
  r.err = std::max(0.0, total_sq - best_gain);
  if (best_m == n) {
    r.a_c = r.a_s = float(total / double(n));
    r.p = v.back();
  } else {
    double sc = 0;
    for (int64_t i = 0; i < best_m; ++i) sc += v[size_t(i)];
    r.a_c = float(sc / double(best_m));
    r.a_s = float((total - sc) / double(n - best_m));
    r.p = v[size_t(best_m - 1)];
  }
  return r;
}

float billm_set_column(BillmBlock& b, int j, bool salient, float x) {
  const float a = std::fabs(x);
  const bool neg = x < 0.0f;
  const float s = neg ? -1.0f : 1.0f;
  b.sgn[j] = neg;
  if (salient) {
    b.sel[j] = a < b.a_1;  // the residual x - a_1 sign(x) has the opposite sign
    return s * b.a_1 + (b.sel[j] ? -b.a_2 : b.a_2);
  }
  // The nearer of the two magnitudes: for the split's own magnitudes that is the split itself
  // (the best 2-group split is a midpoint threshold), and it stays the best after f16 rounding.
  b.sel[j] = b.a_s != b.a_c && std::fabs(a - b.a_s) < std::fabs(a - b.a_c);
  return s * (b.sel[j] ? b.a_s : b.a_c);
}

double billm_encode_block(BillmFormat f, const float* w, const uint8_t* salient, int k, uint8_t* dst, BillmBlock* out) {
  const int g = f.group;
  TERN_ASSERT(k >= 0 && k <= f.slots());
  BillmBlock b;
  bool is_sal[kBillmMaxGroup] = {};
  float sv[kBillmMaxGroup] = {}, ov[kBillmMaxGroup] = {};
  int n_s = 0, n_o = 0;
  for (int i = 0; i < k; ++i) {
    TERN_ASSERT(salient[i] < g && (i == 0 || salient[i] > salient[i - 1]));
    is_sal[salient[i]] = true;
    b.salient[i] = salient[i];
  }
  b.n_salient = k;
  for (int j = 0; j < g; ++j) (is_sal[j] ? sv[n_s++] : ov[n_o++]) = w[j];
  const ResidualBinarization rb = residual_binarize(sv, n_s);
  const SplitBinarization sp = split_binarize(ov, n_o);
  b.a_1 = rb.a_1;
  b.a_2 = rb.a_2;
  b.a_c = billm_round_f16(sp.a_c);
  b.a_s = billm_round_f16(sp.a_s);
  double err = 0;
  for (int j = 0; j < g; ++j) {
    const float v = billm_set_column(b, j, is_sal[j], w[j]);
    err += double(w[j] - v) * double(w[j] - v);
  }
  billm_pack_block(f, b, dst);
  if (out) *out = b;
  return err;
}

void billm_encode_sign_block(BillmFormat f, const float* w, uint8_t* dst) {
  BillmBlock b;
  double s = 0;
  for (int j = 0; j < f.group; ++j) {
    b.sgn[j] = w[j] < 0.0f;
    s += std::fabs(w[j]);
  }
  b.a_c = b.a_s = billm_round_f16(float(s / f.group));
  billm_pack_block(f, b, dst);
}

void billm_encode_rtn(BillmFormat f, const float* w, int64_t n, uint8_t* dst) {
  const int g = f.group;
  std::vector<uint8_t> tmp(static_cast<size_t>(f.block_bytes()));
  for (int64_t blk = 0; blk < n / g; ++blk) {
    const float* wb = w + blk * g;
    uint8_t* out = dst + blk * f.block_bytes();
    int order[kBillmMaxGroup];
    std::iota(order, order + g, 0);
    std::stable_sort(order, order + g, [&](int a, int b) { return std::fabs(wb[a]) > std::fabs(wb[b]); });
    double best = billm_encode_block(f, wb, nullptr, 0, out);
    for (int k = 1; k <= f.slots(); ++k) {
      uint8_t cols[kBillmMaxGroup] = {};
      for (int i = 0; i < k; ++i) cols[i] = uint8_t(order[i]);
      std::sort(cols, cols + k);
      const double err = billm_encode_block(f, wb, cols, k, tmp.data());
      if (err < best) {
        best = err;
        std::memcpy(out, tmp.data(), tmp.size());
      }
    }
  }
}

void billm_decode(BillmFormat f, const uint8_t* src, float* dst, int64_t n) {
  BillmBlock b;
  for (int64_t blk = 0; blk < n / f.group; ++blk) {
    billm_unpack_block(f, src + blk * f.block_bytes(), &b);
    billm_block_values(f, b, dst + blk * f.group);
  }
}

void billm_g64_to_float(const void* src, float* dst, int64_t n) {
  billm_decode({64}, static_cast<const uint8_t*>(src), dst, n);
}
void billm_g128_to_float(const void* src, float* dst, int64_t n) {
  billm_decode({128}, static_cast<const uint8_t*>(src), dst, n);
}
void billm_g64_from_float(const float* src, void* dst, int64_t n) {
  billm_encode_rtn({64}, src, n, static_cast<uint8_t*>(dst));
}
void billm_g128_from_float(const float* src, void* dst, int64_t n) {
  billm_encode_rtn({128}, src, n, static_cast<uint8_t*>(dst));
}

}  // namespace tern
