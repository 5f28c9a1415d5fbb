#pragma once
// BiLLM's binarized weights (Huang et al. 2024) stored as tern's own type (ids 1030+, core/dtype.h):
// the byte layout, the block packer, the two binarizers BiLLM combines and a Hessian-free encoder
// (the format's from_float). compress/billm.h chooses the salient columns with the calibration
// Hessian and compensates the binarization error; this file only stores what it chose.
//
// A row of n_in weights is n_in / g blocks (g = 64: billm_g64, g = 128: billm_g128); a block is
// g/4 + 8 + g/32 bytes:
//
//   | sgn: g/8 bytes | sel: g/8 bytes | a_c | a_s | a_1 | a_2 (f16 each) | idx: g/32 bytes |
//
// Bit j % 8 of byte j / 8 of a plane belongs to column j of the block. idx lists the block's
// salient columns (0 .. g-1), ascending, followed by 0xFF in the unused slots. Column j's weight:
//
//   non-salient:  w = s_j * (sel_j ? a_s : a_c)        the split groups: sparse (|w| > p) and
//                                                       concentrated (|w| <= p), one magnitude each
//   salient:      w = s_j * a_1 + r_j * a_2             residual (second-order) binarization
//
// with s_j = sgn_j ? -1 : +1 and r_j = sel_j ? -1 : +1 (the residual's sign). Every weight costs
// its two plane bits; the magnitudes and the salient list are per row and block, so a row decodes
// on its own (the traits-table rule) at the true cost of 2 + 64/g + 8/32 bits per weight: 3.25
// (g = 64) and 2.75 (g = 128), every scale and mask counted.
#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace tern {

inline constexpr uint8_t kBillmNoColumn = 0xFF;  // an unused salient-column slot
inline constexpr int kBillmMaxGroup = 128;

struct BillmFormat {
  int group = 128;
  int slots() const { return group / 32; }  // salient columns a block can list
  int64_t block_bytes() const { return group / 4 + 8 + group / 32; }
};

bool is_billm(DType t);
BillmFormat billm_format(DType t);          // t must be a BiLLM type
std::optional<DType> billm_type(int group);  // nullopt unless group is 64 or 128

// One block unpacked: plane bits as 0/1 bytes, the magnitudes as their f16 values.
struct BillmBlock {
  uint8_t sgn[kBillmMaxGroup] = {};
  uint8_t sel[kBillmMaxGroup] = {};
  float a_c = 0, a_s = 0, a_1 = 0, a_2 = 0;
  int n_salient = 0;
  uint8_t salient[kBillmMaxGroup / 32] = {};  // ascending
};

// Packs b (magnitudes rounded to f16; salient ascending, n_salient <= slots) into dst.
void billm_pack_block(BillmFormat f, const BillmBlock& b, uint8_t* dst);
// Unpacks a block; the salient list ends at the first unused slot.
void billm_unpack_block(BillmFormat f, const uint8_t* src, BillmBlock* b);
// A block's g weights.
void billm_block_values(BillmFormat f, const BillmBlock& b, float* dst);

// What a block holds that no encoder writes (a non-finite or negative magnitude, a salient index
// out of range or out of order, a used slot after an unused one), or nullptr when it is sound.
const char* billm_block_defect(BillmFormat f, const uint8_t* src);

// ---- the binarizers ------------------------------------------------------------------------

// Residual binarization of n values: a_1 = mean |w|, then a_2 = mean |w - a_1 sign(w)|, so
// w ~ a_1 sign(w) + a_2 sign(w - a_1 sign(w)). a_1 and a_2 are rounded to f16 (a_2 is fitted
// to the rounded a_1), as the format stores them.
struct ResidualBinarization {
  float a_1 = 0, a_2 = 0;
};
ResidualBinarization residual_binarize(const float* w, int64_t n);

// The split of n values by a break point p on |w| into a concentrated (|w| <= p) and a sparse
// (|w| > p) group, each binarized as sign(w) times its mean |w|: the p with the least squared
// error, searched exactly over every break between sorted |w| (no split, one magnitude, is the
// break at either end, so the error is never above plain sign binarization's).
struct SplitBinarization {
  float p = 0;           // the largest |w| of the concentrated group
  float a_c = 0, a_s = 0;
  double err = 0;        // sum of squared errors with the unrounded magnitudes
};
SplitBinarization split_binarize(const float* w, int64_t n);

// Encodes one block of g weights w with the given salient columns (ascending, k <= slots):
// residual binarization of the salient ones, the split search over the rest. Returns the squared
// error of what dst decodes to; *blk (when given) receives the block unpacked.
double billm_encode_block(BillmFormat f, const float* w, const uint8_t* salient, int k, uint8_t* dst,
                          BillmBlock* blk = nullptr);
// Sets column j's two bits to the code nearest x under the block's magnitudes (the encoder's
// rule: the sign of x, then the nearer split magnitude, or for a salient column the sign of the
// residual x - a_1 sign(x)); returns the weight they decode to. GPTQ-style callers pick a column's
// bits after the errors of the columns before it were pushed onto it.
float billm_set_column(BillmBlock& b, int j, bool salient, float x);
// Plain sign binarization in the same layout: no salient columns, one magnitude (mean |w|).
void billm_encode_sign_block(BillmFormat f, const float* w, uint8_t* dst);

// The Hessian-free encoder (the traits table's from_float): per block the salient columns are the
// k largest |w| of the row, k = 0 .. slots chosen by the least squared error.
void billm_encode_rtn(BillmFormat f, const float* w, int64_t n, uint8_t* dst);
void billm_decode(BillmFormat f, const uint8_t* src, float* dst, int64_t n);

// Traits-table entries (quant_traits.cpp): rows of n (a multiple of the group).
void billm_g64_to_float(const void* src, float* dst, int64_t n);
void billm_g128_to_float(const void* src, float* dst, int64_t n);
void billm_g64_from_float(const float* src, void* dst, int64_t n);
void billm_g128_from_float(const float* src, void* dst, int64_t n);

}  // namespace tern
