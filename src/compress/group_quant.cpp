#include "compress/group_quant.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

std::vector<float> GroupQuant::dequantize() const {
  std::vector<float> w(static_cast<size_t>(n_out * n_in));
  const int64_t ng = n_groups();
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t i = 0; i < n_in; ++i) {
      const int64_t g = o * ng + i / group;
      w[size_t(o * n_in + i)] = d[size_t(g)] * float(int(q[size_t(o * n_in + i)]) - int(z[size_t(g)]));
    }
  return w;
}

int64_t choose_group(int64_t n_in, int64_t requested) { return n_in < requested ? n_in : requested; }

GroupQuant rtn_group_quant(const float* w, int64_t n_out, int64_t n_in, int bits, int64_t group, ThreadPool& pool) {
  GroupQuant gq;
  gq.bits = bits;
  gq.group = group;
  gq.n_out = n_out;
  gq.n_in = n_in;
  gq.q.resize(size_t(n_out * n_in));
  const int64_t ng = gq.n_groups();
  gq.d.resize(size_t(n_out * ng));
  gq.z.resize(size_t(n_out * ng));
  const TqFormat f{bits, int(group)};
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t c0 = g * group, c1 = std::min(n_in, c0 + group);
        float d;
        int z;
        tq_params(f, w + o * n_in + c0, c1 - c0, &d, &z);
        gq.d[size_t(o * ng + g)] = d;
        gq.z[size_t(o * ng + g)] = uint8_t(z);
        for (int64_t i = c0; i < c1; ++i)
          gq.q[size_t(o * n_in + i)] = uint8_t(tq_quantize_value(w[o * n_in + i], d, z, f.maxq()));
      }
  });
  return gq;
}

std::optional<DType> group_quant_type(int bits, int64_t group, int64_t n_in) {
  if (group <= 0 || n_in % group != 0) return std::nullopt;
  return tq_type(bits, int(group));
}

std::vector<uint8_t> pack_group_quant(const GroupQuant& gq) {
  const auto type = group_quant_type(gq.bits, gq.group, gq.n_in);
  if (!type) fail("no tern type stores ", gq.bits, "-bit groups of ", gq.group, " in rows of ", gq.n_in);
  const TqFormat f = tq_format(*type);
  const int64_t rb = dtype_row_bytes(*type, gq.n_in), ng = gq.n_groups();
  std::vector<uint8_t> out(static_cast<size_t>(rb * gq.n_out));
  for (int64_t o = 0; o < gq.n_out; ++o)
    for (int64_t g = 0; g < ng; ++g)
      tq_pack_group(f, gq.q.data() + o * gq.n_in + g * gq.group, gq.d[size_t(o * ng + g)], gq.z[size_t(o * ng + g)],
                    out.data() + o * rb + g * f.block_bytes());
  return out;
}

}  // namespace tern
