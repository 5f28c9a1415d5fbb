#include "compress/billm.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "compress/linalg.h"
#include "core/error.h"

namespace tern {

std::vector<int> billm_salient_order(const double* w, int64_t n_out, int64_t ld, int g, const double* u_diag) {
  std::vector<double> s(static_cast<size_t>(g), 0.0);
  for (int64_t o = 0; o < n_out; ++o)
    for (int j = 0; j < g; ++j) s[size_t(j)] += w[o * ld + j] * w[o * ld + j];
  for (int j = 0; j < g; ++j) s[size_t(j)] /= u_diag[j] * u_diag[j];
  std::vector<int> order(static_cast<size_t>(g));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[size_t(a)] > s[size_t(b)]; });
  return order;
}

std::vector<uint8_t> billm_quantize(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>& hessian,
                                    const BillmOptions& opts, ThreadPool& pool, BillmStats* stats) {
  const auto type = billm_type(opts.group);
  if (!type) fail("billm: block size ", opts.group, " is not 64 or 128");
  if (n_in % opts.group != 0) fail("billm: rows of ", n_in, " do not split into blocks of ", opts.group);
  if (int64_t(hessian.size()) != n_in * n_in) fail("billm: the Hessian is not ", n_in, " x ", n_in);
  if (opts.damp < 0) fail("--damp must be >= 0");
  const BillmFormat f = billm_format(*type);
  const int g = f.group;
  const int64_t bb = f.block_bytes(), rb = n_in / g * bb;

  std::vector<double> h = hessian;
  int64_t n_dead = 0;
  const std::vector<bool> dead = mark_dead_inputs(h, n_in, &n_dead);
  double damp = opts.damp;
  const std::vector<double> u = inverse_cholesky_upper(h, n_in, opts.damp, pool, &damp, "billm");  // U^T U = H^-1

  // The weights as the error compensation leaves them, [n_out, n_in] (dead inputs' weights 0).
  std::vector<double> wd(static_cast<size_t>(n_out * n_in));
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t j = 0; j < n_in; ++j) wd[size_t(o * n_in + j)] = dead[size_t(j)] ? 0.0 : double(w[o * n_in + j]);

  std::vector<uint8_t> out(static_cast<size_t>(n_out * rb));
  const int n_k = f.slots() + 1;
  std::vector<double> err(static_cast<size_t>(n_k * n_out));  // [k][row] squared weight error
  std::vector<int> row_k(static_cast<size_t>(n_out));
  std::vector<double> u_diag(static_cast<size_t>(g));
  std::vector<uint8_t> scratch_blocks(static_cast<size_t>(pool.size() * bb));
  int64_t n_salient = 0;

  // The squared error of each candidate count k of row o's block, with `order` its columns by
  // saliency: the k first are residual-binarized.
  auto errors_of = [&](int64_t o, int64_t c0, const std::vector<int>& order, uint8_t* tmp) {
    float blk[kBillmMaxGroup];
    uint8_t cols[kBillmMaxGroup] = {};
    for (int j = 0; j < g; ++j) blk[j] = float(wd[size_t(o * n_in + c0 + j)]);
    for (int k = 0; k < n_k; ++k) {
      for (int i = 0; i < k; ++i) cols[i] = uint8_t(order[size_t(i)]);
      std::sort(cols, cols + k);
      err[size_t(k * n_out + o)] = billm_encode_block(f, blk, cols, k, tmp);
    }
  };
  for (int64_t c0 = 0; c0 < n_in; c0 += g) {
    for (int j = 0; j < g; ++j) u_diag[size_t(j)] = u[size_t((c0 + j) * n_in + c0 + j)];
    std::vector<int> shared_order;
    if (opts.shared_salient) {
      // BiLLM's structured choice: one set of columns for every row of the block, its size by the
      // block's total error.
      shared_order = billm_salient_order(wd.data() + c0, n_out, n_in, g, u_diag.data());
      pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int t) {
        for (int64_t o = o0; o < o1; ++o) errors_of(o, c0, shared_order, scratch_blocks.data() + t * bb);
      });
      int best_k = 0;
      double best = -1;
      for (int k = 0; k < n_k; ++k) {
        double e = 0;
        for (int64_t o = 0; o < n_out; ++o) e += err[size_t(k * n_out + o)];
        if (best < 0 || e < best) {
          best = e;
          best_k = k;
        }
      }
      std::fill(row_k.begin(), row_k.end(), best_k);
    }
    // Per row: the magnitudes and the salient list fixed at the block's start (from the weights
    // as the blocks before left them), then each column's bits chosen on its weight after the
    // errors of the columns before it were pushed onto it, and its own error pushed on (GPTQ's
    // update): the rows of tern's models are one or two blocks, so errors must travel within a
    // block to travel at all.
    pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int t) {
      uint8_t* tmp = scratch_blocks.data() + t * bb;
      float blk[kBillmMaxGroup];
      uint8_t cols[kBillmMaxGroup] = {};
      for (int64_t o = o0; o < o1; ++o) {
        double* row = wd.data() + o * n_in;
        std::vector<int> own_order;
        if (!opts.shared_salient) {
          own_order = billm_salient_order(row + c0, 1, n_in, g, u_diag.data());
          errors_of(o, c0, own_order, tmp);
          int best_k = 0;
          for (int k = 1; k < n_k; ++k)
            if (err[size_t(k * n_out + o)] < err[size_t(best_k * n_out + o)]) best_k = k;
          row_k[size_t(o)] = best_k;
        }
        const std::vector<int>& order = opts.shared_salient ? shared_order : own_order;
        const int k = row_k[size_t(o)];
        for (int i = 0; i < k; ++i) cols[i] = uint8_t(order[size_t(i)]);
        std::sort(cols, cols + k);
        bool is_sal[kBillmMaxGroup] = {};
        for (int i = 0; i < k; ++i) is_sal[cols[i]] = true;
        for (int j = 0; j < g; ++j) blk[j] = float(row[c0 + j]);
        BillmBlock b;
        billm_encode_block(f, blk, cols, k, tmp, &b);
        for (int i = 0; i < g; ++i) {
          const int64_t c = c0 + i;
          const double v = billm_set_column(b, i, is_sal[i], float(row[c]));
          const double* uc = u.data() + c * n_in;
          const double e = (row[c] - v) / uc[c];
          for (int64_t j = c + 1; j < n_in; ++j) row[j] -= e * uc[j];
        }
        billm_pack_block(f, b, out.data() + o * rb + c0 / g * bb);
      }
    });
    for (int64_t o = 0; o < n_out; ++o) n_salient += row_k[size_t(o)];
  }
  if (stats) {
    stats->damp_used = damp;
    stats->dead_columns = n_dead;
    stats->salient_columns = n_salient;
    stats->blocks = n_in / g;
  }
  return out;
}

namespace {

template <class EncodeRow>
std::vector<uint8_t> encode_rows_with(int64_t n_out, int64_t n_in, int group, ThreadPool& pool, EncodeRow&& enc) {
  const auto type = billm_type(group);
  if (!type) fail("billm: block size ", group, " is not 64 or 128");
  if (n_in % group != 0) fail("billm: rows of ", n_in, " do not split into blocks of ", group);
  const int64_t rb = dtype_row_bytes(*type, n_in);
  std::vector<uint8_t> out(static_cast<size_t>(n_out * rb));
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o) enc(o, out.data() + o * rb);
  });
  return out;
}

}  // namespace

std::vector<uint8_t> billm_encode_rows_rtn(const float* w, int64_t n_out, int64_t n_in, int group, ThreadPool& pool) {
  const BillmFormat f{group};
  return encode_rows_with(n_out, n_in, group, pool,
                          [&](int64_t o, uint8_t* dst) { billm_encode_rtn(f, w + o * n_in, n_in, dst); });
}

std::vector<uint8_t> billm_encode_rows_sign(const float* w, int64_t n_out, int64_t n_in, int group, ThreadPool& pool) {
  const BillmFormat f{group};
  return encode_rows_with(n_out, n_in, group, pool, [&](int64_t o, uint8_t* dst) {
    for (int64_t b = 0; b < n_in / group; ++b) billm_encode_sign_block(f, w + o * n_in + b * group, dst + b * f.block_bytes());
  });
}

}  // namespace tern
