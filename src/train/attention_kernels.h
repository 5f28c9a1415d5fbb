#pragma once
// Internal to train/attention*.cpp (and its tests and benchmark): the ISA variants behind
// attention_forward / attention_backward.
//
// attention_tile_impl.h is compiled three times: for AVX-512 (attention_avx512.cpp), for AVX2
// (attention_avx2.cpp) and for the baseline x86-64 target (attention.cpp, the Ref variant).
// Each build exposes only the plain functions below over plain data, so that baseline code
// never calls an inline function compiled with other ISA flags (the ODR would let the linker
// keep either copy).
//
// A unit is one (sequence, kv head): it reads that sequence's q rows of the group's query
// heads and the kv head's k/v rows, and writes exactly the matching rows of o/lse (forward) or
// dq/dk/dv (backward), nothing else. attention.cpp runs the units over the thread pool; a
// unit's arithmetic never depends on which thread runs it, so results are bit-identical for
// any thread count.
#include <cstdint>

#include "train/attention.h"

namespace tern {
enum class Isa;
class ThreadPool;
}  // namespace tern

namespace tern::train::detail {

struct AttentionForwardArgs {
  AttentionShape shape;
  const float* q;
  const float* k;
  const float* v;
  float* o;
  float* lse;
};

struct AttentionBackwardArgs {
  AttentionShape shape;
  const float* q;
  const float* k;
  const float* v;
  const float* o;
  const float* lse;
  const float* d_o;
  float* dq;
  float* dk;
  float* dv;
};

// Scratch floats one unit needs (the same figure serves forward and backward); the unit
// functions want it 64-byte aligned.
int64_t attention_unit_scratch_floats_avx512(const AttentionShape& s);
int64_t attention_unit_scratch_floats_avx2(const AttentionShape& s);
int64_t attention_unit_scratch_floats_baseline(const AttentionShape& s);

void attention_forward_unit_avx512(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch);
void attention_forward_unit_avx2(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch);
void attention_forward_unit_baseline(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch);

void attention_backward_unit_avx512(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch);
void attention_backward_unit_avx2(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch);
void attention_backward_unit_baseline(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch);

// attention_forward / attention_backward with one specific variant (tests, benchmarks):
// Isa::Ref runs the baseline build of the tiles (not the scalar references). Throws
// tern::Error when the CPU cannot run `isa`.
void attention_forward_isa(Isa isa, ThreadPool* pool, const AttentionShape& s, const float* q, const float* k,
                           const float* v, float* o, float* lse);
void attention_backward_isa(Isa isa, ThreadPool* pool, const AttentionShape& s, const float* q, const float* k,
                            const float* v, const float* o, const float* lse, const float* d_o, float* dq,
                            float* dk, float* dv);

}  // namespace tern::train::detail
