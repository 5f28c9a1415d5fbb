#include "dist/step_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace tern::dist {
namespace {

constexpr uint32_t kPlanMagic = 0x6e6c7074;  // "tpln"

struct Writer {
  std::vector<uint8_t> out;
  void put_bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
  }
  template <typename T>
  void put(const T& v) { put_bytes(&v, sizeof(T)); }
  void put_ints(std::span<const int32_t> v) { put_bytes(v.data(), v.size_bytes()); }
};

struct Reader {
  std::span<const uint8_t> in;
  size_t at = 0;
  template <typename T>
  T get() {
    if (in.size() - at < sizeof(T)) fail("step plan: truncated message (", in.size(), " bytes)");
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  void get_ints(int32_t* dst, int64_t n) {
    if (n < 0 || int64_t(in.size() - at) / int64_t(sizeof(int32_t)) < n)
      fail("step plan: truncated message (", in.size(), " bytes)");
    if (n > 0) std::memcpy(dst, in.data() + at, size_t(n) * sizeof(int32_t));  // (dst may be null when n is 0)
    at += size_t(n) * sizeof(int32_t);
  }
};

struct SeqHeader {
  int64_t n_past, pos, n_tokens, n_slots;
  int32_t flags, n_lora;  // kAllLogits | kKeyMass
};
constexpr int32_t kAllLogits = 1, kKeyMass = 2;

}  // namespace

std::vector<uint8_t> encode_step(std::span<const SeqBatch> seqs, uint64_t kv_id, int64_t kv_slots, KvType kv_type) {
  Writer w;
  w.put(kPlanMagic);
  w.put(int32_t(kv_type));
  w.put(kv_id);
  w.put(kv_slots);
  w.put(int64_t(seqs.size()));
  for (const SeqBatch& s : seqs)
    w.put(SeqHeader{s.n_past, s.pos, int64_t(s.tokens.size()), int64_t(s.slots.size()),
                    (s.all_logits ? kAllLogits : 0) | (s.key_mass ? kKeyMass : 0), s.lora ? int32_t(s.lora->size()) : 0});
  for (const SeqBatch& s : seqs) w.put_ints(s.tokens);
  for (const SeqBatch& s : seqs) w.put_ints(s.slots);
  for (const SeqBatch& s : seqs)
    if (s.lora)
      for (const LoraUse& u : *s.lora) w.put(LoraRef{u.adapter->uid(), u.scale, 0});
  return std::move(w.out);
}

StepPlan decode_step(std::span<const uint8_t> bytes) {
  Reader r{bytes};
  if (r.get<uint32_t>() != kPlanMagic) fail("step plan: not a step plan message");
  StepPlan p;
  p.kv_type = KvType(r.get<int32_t>());
  p.kv_id = r.get<uint64_t>();
  p.kv_slots = r.get<int64_t>();
  const int64_t n_seqs = r.get<int64_t>();
  if (n_seqs < 0 || n_seqs > int64_t((bytes.size() - r.at) / sizeof(SeqHeader)))
    fail("step plan: bad sequence count ", n_seqs);
  bool known_type = false;
  for (const KvTypeTraits& t : kv_types()) known_type = known_type || t.type == p.kv_type;
  if (!known_type) fail("step plan: unknown K/V type ", int(p.kv_type));
  std::vector<SeqHeader> heads;
  int64_t n_tokens = 0, n_slots = 0, n_lora = 0;
  for (int64_t i = 0; i < n_seqs; ++i) {
    heads.push_back(r.get<SeqHeader>());
    const SeqHeader& h = heads.back();
    // Counts checked against the ints the rest of the message can hold before any arithmetic
    // or allocation on them (a corrupt count would overflow or allocate terabytes).
    const int64_t room = int64_t((bytes.size() - r.at) / sizeof(int32_t));
    if (h.n_past < 0 || h.n_tokens < 1 || h.n_slots < 0 || h.n_tokens > room || h.n_slots > room ||
        h.n_slots - h.n_tokens < h.n_past)
      fail("step plan: sequence ", i, " has inconsistent sizes");
    if ((h.flags & ~(kAllLogits | kKeyMass)) != 0) fail("step plan: sequence ", i, " has unknown flags ", h.flags);
    if (h.n_lora < 0 || h.n_lora > int64_t((bytes.size() - r.at) / sizeof(LoraRef)))
      fail("step plan: sequence ", i, " has a bad adapter count ", h.n_lora);
    n_tokens += h.n_tokens;
    n_slots += h.n_slots;
    n_lora += h.n_lora;
    if (n_tokens + n_slots > room || n_lora > int64_t((bytes.size() - r.at) / sizeof(LoraRef)))
      fail("step plan: truncated message (", bytes.size(), " bytes)");
  }
  p.tokens.resize(size_t(n_tokens));
  p.slots.resize(size_t(n_slots));
  r.get_ints(p.tokens.data(), n_tokens);
  r.get_ints(p.slots.data(), n_slots);
  for (const SeqHeader& h : heads) {
    std::vector<LoraRef>& refs = p.lora.emplace_back();
    for (int32_t k = 0; k < h.n_lora; ++k) {
      refs.push_back(r.get<LoraRef>());
      if (!std::isfinite(refs.back().scale)) fail("step plan: an adapter's scale is not finite");
    }
  }
  if (r.at != bytes.size()) fail("step plan: ", bytes.size() - r.at, " bytes left over");
  int64_t t = 0, sl = 0;
  for (const SeqHeader& h : heads) {
    SeqBatch s;
    s.n_past = h.n_past;
    s.pos = h.pos;
    s.all_logits = (h.flags & kAllLogits) != 0;
    p.key_mass.push_back((h.flags & kKeyMass) != 0);
    s.tokens = std::span<const int32_t>(p.tokens.data() + t, size_t(h.n_tokens));
    s.slots = std::span<const int32_t>(p.slots.data() + sl, size_t(h.n_slots));
    p.seqs.push_back(s);
    t += h.n_tokens;
    sl += h.n_slots;
  }
  return p;
}

std::vector<MicroBatch> split_micro_batches(std::span<const SeqBatch> seqs, int m) {
  int64_t T = 0;
  for (const SeqBatch& s : seqs) T += int64_t(s.tokens.size());
  std::vector<MicroBatch> out;
  if (T == 0) return out;
  m = int(std::clamp<int64_t>(m, 1, T));
  // Micro-batch b holds the step's tokens [T * b / m, T * (b + 1) / m).
  int64_t row = 0;  // the step's next logits row
  size_t si = 0;
  int64_t off = 0;  // tokens of seqs[si] already placed
  for (int b = 0; b < m; ++b) {
    MicroBatch mb;
    int64_t want = T * (b + 1) / m - T * b / m;
    while (want > 0) {
      const SeqBatch& s = seqs[si];
      const int64_t n = int64_t(s.tokens.size());
      if (n == 0) {
        ++si;
        continue;
      }
      const int64_t take = std::min(want, n - off);
      SeqBatch piece = s;
      piece.n_past = s.n_past + off;
      piece.pos = s.pos >= 0 ? s.pos + off : -1;
      piece.tokens = s.tokens.subspan(size_t(off), size_t(take));
      piece.slots = s.slots.subspan(0, size_t(s.n_past + off + take));
      const bool last_piece = off + take == n;
      if (s.all_logits) {
        for (int64_t i = 0; i < take; ++i) mb.logit_rows.push_back(row + off + i);
      } else {
        mb.logit_rows.push_back(last_piece ? row : -1);
      }
      mb.seqs.push_back(piece);
      mb.n_tokens += take;
      want -= take;
      off += take;
      if (last_piece) {
        row += s.all_logits ? n : 1;
        ++si;
        off = 0;
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace tern::dist
