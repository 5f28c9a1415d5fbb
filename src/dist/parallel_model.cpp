#include "dist/parallel_model.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/comm.h"
#include "dist/jobs.h"
#include "dist/step_plan.h"
#include "models/lora.h"

namespace tern::dist {
namespace {

// What rank 0 sends every worker: a header, then `bytes` of payload.
// Every message about a model names it by rank 0's id (LoadRequest::model_id): during a live base
// swap the ranks hold two models, the old one finishing its requests while the new one starts.
// A load is two messages: Load starts it (every rank loads its part in the background, serving
// the other models' steps meanwhile), LoadDone ends it (each rank's status gathered).
enum class MsgKind : int32_t { Load = 1, Step = 2, Exit = 3, Timeline = 4, Job = 5, CopySlots = 6, Adapter = 7,
                               DropAdapters = 8, SinkKeys = 9, Unload = 10, LoadDone = 11 };

// StreamingLLM's sinks that follow the window (Model::keep_sink_keys / place_sink_keys /
// drop_sink_keys) on every rank's part of one of rank 0's K/V arenas.
enum class SinkOp : int32_t { Keep = 0, Place = 1, Drop = 2 };
struct SinkKeysRequest {
  uint64_t model_id;
  uint64_t kv_id;
  int64_t kv_slots;
  int32_t kv_type;
  SinkOp op;
  int64_t slot, shift;
};

// A LoRA adapter for every rank, before the first step that runs it: rank 0's uid (what step
// plans name it by), then its name (rank 0's path, for messages), then an adapter file's bytes
// (lora_adapter_bytes: the same operands on every rank, nothing read from the rank's disk).
struct AdapterRequest {
  uint64_t model_id;
  uint64_t uid;
  int64_t name_bytes;
};

// Copy-on-write of K/V slots (the engine's shared blocks), on every rank's arena.
struct CopySlotsRequest {
  uint64_t model_id;
  uint64_t kv_id;
  int64_t kv_slots;
  int32_t kv_type, pad;
  int64_t src, dst, n;
};
struct MsgHeader {
  MsgKind kind;
  int32_t pad = 0;
  int64_t bytes = 0;
};

// The load request: the model's id, the layout, rank 0's thread count, and what the file must be.
struct LoadRequest {
  uint64_t model_id;
  int32_t tp, pp, micro_batches, n_threads;
  uint64_t fingerprint;
  uint64_t file_size;
  // followed by the path
};

// Point-to-point tags: a micro-batch's activations, and its logits back to rank 0.
constexpr int kTagActivations = 1 << 20;
constexpr int kTagLogits = 2 << 20;
constexpr int kTagMessage = 3 << 20;  // rank 0's messages: the header, then (+ 1) the payload
constexpr int64_t kStatusBytes = 1024;  // one rank's load status: "" or its error
constexpr size_t kMaxIntervals = 1 << 16;  // busy intervals a rank keeps between collections
constexpr size_t kMaxFlights = 8;           // a worker's pipelined steps whose sends may be in flight
constexpr int kPollMicroseconds = 20;       // rank 0: a pipelined step's wait for its logits, between turns

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// FNV-1a over what makes two files the same model: architecture, tensor names, types, shapes
// and sizes, and the file's size.
uint64_t fingerprint(const GgufFile& f) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const std::string arch = f.get_string("general.architecture");
  mix(arch.data(), arch.size());
  for (const auto& t : f.tensors()) {
    mix(t.name.data(), t.name.size());
    mix(&t.type, sizeof t.type);
    for (int64_t d : t.ne) mix(&d, sizeof d);
    mix(&t.n_bytes, sizeof t.n_bytes);
  }
  return h;
}

// One model's part on this rank, and the communicator of its stage's ranks.
struct Part {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Comm> tp_comm;  // the ranks of this rank's stage (the model's all-reduces use it)
  std::unique_ptr<Model> model;
  std::vector<int64_t> stage_bounds;  // the stages' layers (model_stage_bounds)
  // Workers: the adapters rank 0 sent for this model, by rank 0's uid, until it says they are gone.
  std::map<uint64_t, std::shared_ptr<const LoraAdapter>> adapters;
  // Workers: this rank's arenas, by rank 0's arena id.
  std::map<uint64_t, KvStore> kvs;
};

// One rank's share of the work: its parts of the models loaded (one, or two during a live base
// swap) and the steps' bookkeeping.
struct Executor {
  ParallelLayout layout;
  int rank = 0;
  std::map<uint64_t, Part> parts;  // by rank 0's model id
  uint64_t next_model_id = 1;      // rank 0
  int64_t step = 0;
  std::vector<BusyInterval> timeline;
  std::vector<float> scratch_logits;  // a tensor-parallel worker's gathered logits (unused)
  std::vector<float> mass_parts;  // this rank's part of a step's key masses, then their sum

  int stage() const { return layout.stage_of(rank); }
  int tp_rank() const { return layout.tp_rank_of(rank); }

  void record(int mb, int64_t n_tokens, double t0) {
    // Only the recent intervals are kept: a server runs steps for days and nobody may ask.
    if (timeline.size() >= kMaxIntervals) timeline.erase(timeline.begin(), timeline.begin() + kMaxIntervals / 2);
    timeline.push_back(BusyInterval{rank, stage(), tp_rank(), step, mb, n_tokens, t0, now_s()});
  }

  // Model `id`'s part, or an error naming what asked for it.
  Part& part(uint64_t id, const char* what) {
    const auto it = parts.find(id);
    if (it == parts.end() || !it->second.model) fail(what, " for model ", id, ", which is not loaded on this rank");
    return it->second;
  }

  // Starts model `id` on this rank: its (empty) part, and its stage's communicator (a collective:
  // every rank takes part in the split, whatever happens to its load). The caller's thread, the
  // one that talks to the other ranks.
  Part& begin_load(uint64_t id, const ParallelLayout& l) {
    if (!(layout == l)) layout = l;  // (a second model has the first's: readers outside the turns)
    rank = world().rank();
    Part& p = parts[id];
    p.model.reset();
    p.tp_comm = world().split(layout.stage_of(rank), layout.tp_rank_of(rank));
    return p;
  }

  // Loads this rank's part into `p` (begin_load's); "" or the error (the part is then left
  // empty). Talks to no rank: it may run on a thread of its own while steps of the other models
  // run.
  std::string load_part(Part& p, const std::string& path, std::shared_ptr<const GgufFile> f, uint64_t want_fp,
                        uint64_t want_size) const {
    try {
      p.file = f ? std::move(f) : open_model_file(path);
      if (p.file->file_size() != want_size || fingerprint(*p.file) != want_fp)
        fail(path, " on this rank is not rank 0's model file (", p.file->file_size(), " bytes here, ", want_size,
             " there, or other tensors): every rank must open the same model");
      const HParams hp = read_hparams(*p.file);
      p.stage_bounds = model_stage_bounds(*p.file, hp, layout.pp);
      ModelPartition part = partition_of(layout, rank, p.stage_bounds);
      Comm* c = p.tp_comm.get();
      if (layout.tp > 1) {
        part.all_reduce = [c](float* x, int64_t n) { c->all_reduce_sum(x, n); };
        part.all_gather = [c](const float* mine, int64_t n, float* all) {
          c->all_gather(mine, n * int64_t(sizeof(float)), all);
        };
      }
      p.model = load_model(p.file, part);
      return "";
    } catch (const std::exception& e) {
      p.model.reset();
      return e.what();
    }
  }

  // Rank 0's part of a step failed. With tensor parallelism its peers may be inside a collective
  // of this step that rank 0 will never join, and nothing can bring them out of it: the job ends
  // with the message (as a worker's failure ends it) instead of hanging or pairing the peers'
  // collectives with the next step's. A pipeline of one rank per stage can finish the step
  // (run_stage) and goes on.
  void end_job_if_mid_collective(const std::exception& e) const {
    if (rank != 0 || layout.tp == 1) return;
    std::fprintf(stderr, "tern: rank 0: error in a tensor-parallel step, which its peers cannot finish: %s\n", e.what());
    std::fflush(stderr);
    abort_all(1);
  }
  // Tests: TERN_TEST_FAIL_PIPELINE_STEP=N makes rank 0's N-th pipelined step fail in its second
  // micro-batch (its first when it has one), after the first was passed on.
  bool injected_failure_due() const {
    static const int64_t at = [] {
      const char* v = std::getenv("TERN_TEST_FAIL_PIPELINE_STEP");
      return v && *v ? std::atoll(v) : int64_t(0);
    }();
    return at > 0 && step + 1 == at;
  }

  // Runs one step on this rank. logits: rank 0's output ([n_logit_rows, n_vocab]); others
  // pass nullptr.
  void run(Model& model, std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
    if (layout.pp == 1) {
      const int64_t T = n_tokens(seqs);
      if (T == 0) return;
      const double t0 = now_s();
      try {
        model.reserve(T);
        if (!logits) {  // every tensor-parallel rank computes the gathered logits; rank 0 keeps them
          scratch_logits.resize(size_t(n_logit_rows(seqs) * model.hparams().n_vocab));
          logits = scratch_logits.data();
        }
        model.forward(seqs, kv, logits, pool);
      } catch (const std::exception& e) {
        end_job_if_mid_collective(e);
        throw;
      }
      record(0, T, t0);
      ++step;
      return;
    }
    std::unique_ptr<Flight> f = run_stage(model, seqs, kv, pool);
    if (rank == 0) {
      if (f) finish(*f, logits, [&] { return done(*f); });
      recycle(std::move(f));
    } else if (f) {
      sending.push_back(std::move(f));
    }
  }

  // A pipelined step's micro-batches on this rank: their activations and logits, and the sends
  // and receives still running on them (which must not outlive the buffers).
  struct Flight {
    std::vector<MicroBatch> mbs;
    std::vector<std::vector<float>> xs;  // [mb][n_tokens * n_embd]: what this stage passes on
    std::vector<std::vector<float>> ls;  // [mb][logit rows * n_vocab]: the last stage's, or rank 0's copy
    std::vector<Comm::Request> pending;
    int64_t n_vocab = 0;
  };
  std::vector<std::unique_ptr<Flight>> sending;  // workers: pipelined steps whose sends may be in flight
  // Flights done with, for the next steps: their buffers (a step's logits are megabytes) keep
  // their pages instead of being zeroed again (page faults of a fresh buffer cost ~10% of a
  // small model's decode step).
  std::vector<std::unique_ptr<Flight>> spare;

  void recycle(std::unique_ptr<Flight> f) {
    if (f && spare.size() < kMaxFlights) spare.push_back(std::move(f));
  }

  // Runs this rank's stage of a pipelined step over its micro-batches, in order: receives each
  // one's activations from the stage before, runs its layers, sends the result on (the last
  // stage: its logits to rank 0) without waiting. Rank 0 (stage 0) also posts the receives of
  // the step's logits. Returns the step's flight (null for a step without tokens). The workers
  // keep their flights until the sends are done (reap_sends): a worker that waited for its sends
  // at the end of a step would wait for rank 0 to call MPI, which it does not while it runs the
  // next step's stage 0, so the stages would not overlap across steps.
  std::unique_ptr<Flight> run_stage(Model& model, std::span<const SeqBatch> seqs, KvStore& kv, ThreadPool& pool) {
    reap_sends();
    const int64_t T = n_tokens(seqs);
    if (T == 0) return nullptr;
    const int64_t V = model.hparams().n_vocab, E = model.hparams().n_embd;
    std::unique_ptr<Flight> f;
    if (spare.empty()) {
      f = std::make_unique<Flight>();
    } else {
      f = std::move(spare.back());
      spare.pop_back();
    }
    f->pending.clear();
    f->mbs = split_micro_batches(seqs, layout.micro_batch_count());
    f->n_vocab = V;
    const size_t m = f->mbs.size();
    const int s = stage(), r = tp_rank(), last = layout.pp - 1;
    Comm& w = world();
    f->xs.resize(m);
    f->ls.resize(m);
    if (rank == 0)
      for (size_t i = 0; i < m; ++i) {
        f->ls[i].resize(f->mbs[i].logit_rows.size() * size_t(V));
        f->pending.push_back(w.irecv(f->ls[i].data(), int64_t(f->ls[i].size() * sizeof(float)), layout.rank_of(last, 0),
                                     kTagLogits + int(i)));
      }
    for (size_t i = 0; i < m; ++i) {
      const MicroBatch& mb = f->mbs[i];
      std::vector<float>& x = f->xs[i];
      x.resize(size_t(mb.n_tokens * E));
      if (s > 0) w.recv(x.data(), int64_t(x.size() * sizeof(float)), layout.rank_of(s - 1, r), kTagActivations + int(i));
      std::vector<float>& l = f->ls[i];
      if (s == last) l.resize(mb.logit_rows.size() * size_t(V));
      const double t0 = now_s();
      try {
        if (i == 0) model.reserve(T);
        if (rank == 0 && i == std::min<size_t>(1, m - 1) && injected_failure_due())
          fail("a failure injected into pipelined step ", step + 1, " (TERN_TEST_FAIL_PIPELINE_STEP)");
        model.forward_stage(mb.seqs, kv, x.data(), s == last ? l.data() : nullptr, pool);
      } catch (const std::exception& e) {
        // Rank 0 (a worker's failure ends the job): the later stages are waiting for micro-batches
        // i.. of this step. Left so, they would take the next step's activations for these
        // (silently wrong tokens where the sizes match). They get zeros instead, whose logits are
        // dropped, so the step ends on every rank and only its requests fail (the engine rolls
        // the step back).
        if (rank != 0) throw;
        end_job_if_mid_collective(e);
        for (size_t k = i; k < m; ++k) {
          f->xs[k].assign(size_t(f->mbs[k].n_tokens * E), 0.0f);
          f->pending.push_back(w.isend(f->xs[k].data(), int64_t(f->xs[k].size() * sizeof(float)),
                                       layout.rank_of(s + 1, r), kTagActivations + int(k)));
        }
        for (Comm::Request q : f->pending) w.wait(q);
        f->pending.clear();
        recycle(std::move(f));
        ++step;
        throw;
      }
      record(int(i), mb.n_tokens, t0);
      if (s < last)
        f->pending.push_back(w.isend(x.data(), int64_t(x.size() * sizeof(float)), layout.rank_of(s + 1, r),
                                     kTagActivations + int(i)));
      else if (r == 0)
        f->pending.push_back(w.isend(l.data(), int64_t(l.size() * sizeof(float)), 0, kTagLogits + int(i)));
    }
    ++step;
    return f;
  }

  // Whether every send and receive of `f` is done (those done are forgotten). A call to MPI:
  // rank 0 makes it under a turn.
  static bool done(Flight& f) {
    Comm& w = world();
    std::erase_if(f.pending, [&](Comm::Request q) { return w.test(q); });
    return f.pending.empty();
  }

  // Rank 0: waits for `f` with `poll` (true when it is done) and copies the rows of its logits
  // the step asked for into `logits` ([n_logit_rows, n_vocab]).
  template <class Poll>
  static void finish(Flight& f, float* logits, Poll&& poll) {
    while (!poll()) {
    }
    const size_t V = size_t(f.n_vocab);
    for (size_t i = 0; i < f.mbs.size(); ++i)
      for (size_t j = 0; j < f.mbs[i].logit_rows.size(); ++j)
        if (const int64_t row = f.mbs[i].logit_rows[j]; row >= 0)
          std::memcpy(logits + size_t(row) * V, f.ls[i].data() + j * V, V * sizeof(float));
  }

  // Workers: forgets the flights whose sends are done; waits for the oldest while more than a
  // few are in flight (rank 0 takes every message in time: this bounds the memory only).
  void reap_sends() {
    for (auto it = sending.begin(); it != sending.end();)
      if (done(**it)) {
        recycle(std::move(*it));
        it = sending.erase(it);
      } else {
        ++it;
      }
    while (sending.size() > kMaxFlights) {
      for (Comm::Request q : sending.front()->pending) world().wait(q);
      sending.front()->pending.clear();
      recycle(std::move(sending.front()));
      sending.erase(sending.begin());
    }
  }
  void wait_sends() {
    for (const auto& f : sending)
      for (Comm::Request q : f->pending) world().wait(q);
    sending.clear();
  }

  static int64_t n_tokens(std::span<const SeqBatch> seqs) {
    int64_t T = 0;
    for (const SeqBatch& s : seqs) T += int64_t(s.tokens.size());
    return T;
  }

  // Runs a step in which the sequences marked in `wants` collect key masses (H2O): this rank's
  // heads and layers give a part of each key's mass, and the parts are summed over all ranks (a
  // world all-reduce, in rank order: every rank calls it, each knowing the plan) and added into
  // out[i] where it is given (rank 0: the caller's buffers, which accumulate as one process's do).
  void run_with_key_masses(Model& model, std::vector<SeqBatch> seqs, const std::vector<bool>& wants,
                           const std::vector<float*>& out, KvStore& kv, float* logits, ThreadPool& pool) {
    std::vector<int64_t> at(seqs.size(), -1);
    int64_t total = 0;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (wants[i]) {
        at[i] = total;
        total += seqs[i].n_past + int64_t(seqs[i].tokens.size());
      }
    mass_parts.assign(size_t(total), 0.0f);
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].key_mass = at[i] >= 0 ? mass_parts.data() + at[i] : nullptr;
    try {
      run(model, seqs, kv, logits, pool);
    } catch (...) {
      // Rank 0 (a worker's failure ends the job): the step's pipeline was completed (run_stage),
      // and the workers now sum the masses, so rank 0 takes part before it reports the error.
      if (total > 0) world().all_reduce_sum(mass_parts.data(), total);
      throw;
    }
    if (total == 0) return;
    world().all_reduce_sum(mass_parts.data(), total);
    for (size_t i = 0; i < seqs.size(); ++i)
      if (at[i] >= 0 && i < out.size() && out[i])
        for (int64_t j = 0; j < seqs[i].n_past + int64_t(seqs[i].tokens.size()); ++j) out[i][j] += mass_parts[size_t(at[i] + j)];
  }

  // Sends this rank's intervals to rank 0 (or, on rank 0, gathers everyone's).
  std::vector<BusyInterval> exchange_timeline() {
    Comm& w = world();
    std::vector<BusyInterval> all;
    if (rank != 0) {
      const int64_t n = int64_t(timeline.size());
      w.send(&n, sizeof n, 0, 7);
      if (n > 0) w.send(timeline.data(), n * int64_t(sizeof(BusyInterval)), 0, 8);
    } else {
      all = timeline;
      for (int src = 1; src < w.size(); ++src) {
        int64_t n = 0;
        w.recv(&n, sizeof n, src, 7);
        std::vector<BusyInterval> part(static_cast<size_t>(n));
        if (n > 0) w.recv(part.data(), n * int64_t(sizeof(BusyInterval)), src, 8);
        all.insert(all.end(), part.begin(), part.end());
      }
    }
    timeline.clear();
    return all;
  }
};

Executor& executor() {
  static Executor e;
  return e;
}
bool g_released = false;
bool g_active = false;
std::vector<RankInfo> g_infos;
std::mutex g_infos_mutex;  // g_infos is read outside the turns (tern serve's /metrics per rank)

// Rank 0's messages still being sent (a header and its payload to every worker), kept until
// they are: a message goes without waiting for the workers to take it (a worker busy with a
// pipelined step's later stage takes the next step's plan when it is done with it).
struct Outgoing {
  MsgHeader header;
  std::vector<uint8_t> payload;
  std::vector<Comm::Request> pending;
};
std::vector<std::unique_ptr<Outgoing>> g_outbox;

bool sent(Outgoing& o) {
  std::erase_if(o.pending, [](Comm::Request q) { return world().test(q); });
  return o.pending.empty();
}

// Rank 0, in a turn: `kind` and `payload` to every worker (which take rank 0's messages in order).
void broadcast_message(MsgKind kind, std::vector<uint8_t> payload = {}) {
  Comm& w = world();
  std::erase_if(g_outbox, [](const std::unique_ptr<Outgoing>& o) { return sent(*o); });
  auto o = std::make_unique<Outgoing>();
  o->header = MsgHeader{kind, 0, int64_t(payload.size())};
  o->payload = std::move(payload);
  o->pending = w.isend_all(&o->header, sizeof o->header, kTagMessage);
  if (!o->payload.empty()) {
    const std::vector<Comm::Request> more = w.isend_all(o->payload.data(), int64_t(o->payload.size()), kTagMessage + 1);
    o->pending.insert(o->pending.end(), more.begin(), more.end());
  }
  g_outbox.push_back(std::move(o));
}

// Rank 0: waits until every message has gone (before the end of MPI).
void flush_outbox() {
  for (const auto& o : g_outbox)
    for (Comm::Request q : o->pending) world().wait(q);
  g_outbox.clear();
}

// A fixed-size request on one of rank 0's arenas (a copy, sink keys).
template <class R>
R kv_request(const std::vector<uint8_t>& bytes, const char* what) {
  R r;
  if (bytes.size() != sizeof r) fail("malformed ", what);
  std::memcpy(&r, bytes.data(), sizeof r);
  return r;
}

// One rank's share of a SinkKeysRequest, on its own arena (the model's own, local operations).
void apply_sink_op(const Model& model, KvStore& kv, const SinkKeysRequest& r) {
  switch (r.op) {
    case SinkOp::Keep: model.Model::keep_sink_keys(kv, int32_t(r.slot)); break;
    case SinkOp::Place: model.Model::place_sink_keys(kv, int32_t(r.slot), r.shift); break;
    case SinkOp::Drop: model.Model::drop_sink_keys(kv, int32_t(r.slot)); break;
  }
}

// Every rank's "" or error (collective): the first error as "rank N: ...", or "".
std::string first_error(const std::string& error) {
  Comm& w = world();
  struct Status {
    char error[kStatusBytes];
  } mine{};
  std::snprintf(mine.error, sizeof mine.error, "%s", error.c_str());
  std::vector<Status> all(size_t(w.size()));
  w.all_gather(&mine, sizeof mine, all.data());
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].error[0] != '\0')
      return str_cat("rank ", r, ": ", std::string(all[r].error, strnlen(all[r].error, sizeof all[r].error)));
  return "";
}

// Every rank's status of loading model `id`; rank 0 throws for the first failure (and no rank
// keeps its part).
std::vector<RankInfo> gather_load_status(uint64_t id, const std::string& error) {
  Comm& w = world();
  Executor& ex = executor();
  struct Status {
    char error[kStatusBytes];
    RankInfo info;
  } mine{};
  std::snprintf(mine.error, sizeof mine.error, "%s", error.c_str());
  mine.info.rank = w.rank();
  mine.info.stage = ex.layout.stage_of(w.rank());
  mine.info.tp_rank = ex.layout.tp_rank_of(w.rank());
  const auto it = ex.parts.find(id);
  if (it != ex.parts.end() && it->second.model) {
    const Model& m = *it->second.model;
    const HParams& hp = m.hparams();
    const ModelPartition part = partition_of(ex.layout, w.rank(), it->second.stage_bounds);
    mine.info.layer_begin = part.layer_begin;
    mine.info.layer_end = part.layer_end < 0 ? hp.n_layer : part.layer_end;
    mine.info.weight_bytes = m.weight_bytes();
    mine.info.kv_bytes_per_token = kv_bytes_per_token(hp, KvType::F32);
  }
  std::vector<Status> all(size_t(w.size()));
  w.all_gather(&mine, sizeof mine, all.data());
  std::vector<RankInfo> infos;
  for (const Status& s : all) {
    if (s.error[0] != '\0') {
      ex.parts.erase(id);  // a part without the others is of no use
      if (w.rank() == 0) fail("rank ", s.info.rank, ": ", std::string(s.error, strnlen(s.error, sizeof s.error)));
    }
    infos.push_back(s.info);
  }
  return infos;
}

// Rank 0: the ranks follow one conversation, but several threads may talk to them: during a live
// base swap the old base's engine finishes its requests while the new base loads and its engine
// starts. A turn (a message and every collective that belongs to it: a whole step, an adapter's
// check, the start or the end of a load) is taken under this mutex, so the two engines' steps
// take turns, and between a load's two turns the ranks load in the background while steps go
// on. Recursive: a step sends the adapters it needs inside its turn.
std::recursive_mutex& turn_mutex() {
  static std::recursive_mutex m;
  return m;
}

// A message about model `id`: its id, then `body`'s bytes.
std::vector<uint8_t> with_model_id(uint64_t id, const void* body, size_t n) {
  std::vector<uint8_t> payload(sizeof id + n);
  std::memcpy(payload.data(), &id, sizeof id);
  if (n > 0) std::memcpy(payload.data() + sizeof id, body, n);
  return payload;
}

// What rank 0's views of one model share: the model's id, and the adapters the ranks hold for
// it. The ranks let go of the model when the last view is gone (unless they were released: the
// job is ending). Read and changed under the turns.
struct SharedModel {
  explicit SharedModel(uint64_t model_id) : id(model_id) {}
  ~SharedModel() {
    std::lock_guard lock(turn_mutex());
    if (!g_released && world().size() > 1) {
      std::vector<uint8_t> payload = with_model_id(id, nullptr, 0);
      broadcast_message(MsgKind::Unload, std::move(payload));
    }
    executor().parts.erase(id);
  }
  uint64_t id;  // what the ranks know the model by
  std::map<uint64_t, std::weak_ptr<const LoraAdapter>> sent;  // by uid: the adapters the ranks hold
};

// Rank 0's view of the whole model `id` (its own part is executor().parts[id]). Several engines
// may run steps on one model, each through a view of its own (share_parallel_model: a pipeline's
// engines): a pipelined step holds the turn for its plan and its stage 0 only, and waits for its
// logits between turns, so that the other engines' steps enter the pipeline behind it.
class ParallelModel final : public Model {
 public:
  explicit ParallelModel(std::shared_ptr<SharedModel> shared)
      : shared_(std::move(shared)), id_(shared_->id), local_(*executor().parts.at(id_).model) {
    hp_ = local_.hparams();
    weight_bytes_ = local_.weight_bytes();
    decode_weight_memory_ = local_.decode_weight_memory();
  }
  std::unique_ptr<Model> another_view() const {
    std::lock_guard lock(turn_mutex());
    return std::make_unique<ParallelModel>(shared_);
  }
  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override {
    Executor& ex = executor();
    std::unique_lock lock(turn_mutex());
    bool masses = false;
    for (const SeqBatch& s : seqs) {
      if (s.lora)
        for (const LoraUse& u : *s.lora) send_adapter(u.adapter);
      // With tensor parallelism alone rank 0 holds the whole residual stream after the last
      // all-reduce: its own forward writes the hidden states. A pipeline's are on its last stage.
      if (s.hidden && ex.layout.pp > 1) fail("hidden states (embeddings) are not available with --pp");
      if (s.tokens.empty()) fail("a parallel step with an empty sequence");
      masses = masses || s.key_mass != nullptr;
    }
    drop_released_adapters();
    const std::vector<uint8_t> plan = encode_step(seqs, reinterpret_cast<uintptr_t>(&kv), kv.n_slots(), kv.type());
    std::vector<uint8_t> payload = with_model_id(id_, plan.data(), plan.size());
    broadcast_message(MsgKind::Step, std::move(payload));
    // A pipelined step of one engine among several gives the turn up after its stage 0. (A step
    // collecting key masses ends in a world all-reduce, so it keeps its turn to the end; so does
    // the only engine of a model: nobody would use the turn meanwhile.)
    if (ex.layout.pp > 1 && !masses && shared_.use_count() > 1) {
      std::unique_ptr<Executor::Flight> f = ex.run_stage(local_, seqs, kv, pool);
      lock.unlock();
      if (f)
        Executor::finish(*f, logits, [&] {
          {
            std::lock_guard turn(turn_mutex());
            if (Executor::done(*f)) return true;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(kPollMicroseconds));
          return false;
        });
      std::lock_guard turn(turn_mutex());
      ex.recycle(std::move(f));
      return;
    }
    std::vector<bool> wants;
    std::vector<float*> out;
    for (const SeqBatch& s : seqs) {
      wants.push_back(s.key_mass != nullptr);
      out.push_back(s.key_mass);
    }
    ex.run_with_key_masses(local_, std::vector<SeqBatch>(seqs.begin(), seqs.end()), wants, out, kv, logits, pool);
  }
  // The sinks' keys: every rank keeps, rotates and forgets its own heads' and layers' copies.
  void keep_sink_keys(KvStore& kv, int32_t slot) const override { sink_keys(kv, SinkOp::Keep, slot, 0); }
  void place_sink_keys(KvStore& kv, int32_t slot, int64_t shift) const override {
    sink_keys(kv, SinkOp::Place, slot, shift);
  }
  void drop_sink_keys(KvStore& kv, int32_t slot) const override { sink_keys(kv, SinkOp::Drop, slot, 0); }
  bool rotate_keys(int64_t il, float* k, int64_t n_rows, int64_t delta) const override {
    return local_.rotate_keys(il, k, n_rows, delta);  // (every rank's RoPE is the same)
  }
  void copy_kv_slots(KvStore& kv, int64_t src, int64_t dst, int64_t n) override {
    std::lock_guard lock(turn_mutex());
    CopySlotsRequest c{id_, reinterpret_cast<uintptr_t>(&kv), kv.n_slots(), int32_t(kv.type()), 0, src, dst, n};
    std::vector<uint8_t> payload(sizeof c);
    std::memcpy(payload.data(), &c, sizeof c);
    broadcast_message(MsgKind::CopySlots, std::move(payload));
    kv.copy_slots(src, dst, n);
  }
  bool has_hidden_states() const override { return executor().layout.pp == 1; }
  // Evicting policies (sinks + window, H2O) choose slots on rank 0; the plan carries each
  // sequence's kept slots and positions, and H2O's key masses are summed over the ranks.
  bool can_evict_kv() const override { return local_.can_evict_kv(); }
  void reserve(int64_t n_tokens) override { local_.reserve(n_tokens); }
  int64_t max_step_tokens() const override { return local_.max_step_tokens(); }
  // Rank 0's part checks the pairs it holds (its stage's layers; a tensor-parallel rank holds a
  // share of every target). The other stages check theirs when the adapter is sent to them,
  // before the first step that runs it (send_adapter): only the engine's thread talks to the
  // ranks, and this may be called from a request's thread.
  void check_lora(const LoraAdapter& adapter) const override { local_.check_lora(adapter); }

 private:
  void sink_keys(KvStore& kv, SinkOp op, int32_t slot, int64_t shift) const {
    std::lock_guard lock(turn_mutex());
    SinkKeysRequest r{id_, reinterpret_cast<uintptr_t>(&kv), kv.n_slots(), int32_t(kv.type()), op, slot, shift};
    std::vector<uint8_t> payload(sizeof r);
    std::memcpy(payload.data(), &r, sizeof r);
    broadcast_message(MsgKind::SinkKeys, std::move(payload));
    apply_sink_op(local_, kv, r);
  }

  // Sends `adapter` to every rank unless they have it (collective), each rank checking it against
  // its part; throws naming the rank whose part refuses it (then nobody keeps it).
  void send_adapter(const std::shared_ptr<const LoraAdapter>& adapter) {
    if (!adapter) fail("a LoRA adapter entry has no adapter");
    std::map<uint64_t, std::weak_ptr<const LoraAdapter>>& sent = shared_->sent;
    const auto it = sent.find(adapter->uid());
    if (it != sent.end() && !it->second.expired()) return;
    std::vector<uint8_t> payload(sizeof(AdapterRequest));
    const std::string& name = adapter->path();
    const AdapterRequest req{id_, adapter->uid(), int64_t(name.size())};
    std::memcpy(payload.data(), &req, sizeof req);
    payload.insert(payload.end(), name.begin(), name.end());
    const std::vector<uint8_t> bytes = lora_adapter_bytes(*adapter);
    payload.insert(payload.end(), bytes.begin(), bytes.end());
    broadcast_message(MsgKind::Adapter, std::move(payload));
    std::string error;
    try {
      local_.check_lora(*adapter);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (const std::string first = first_error(error); !first.empty()) fail(first);
    sent[adapter->uid()] = adapter;
  }
  // Tells the ranks to let go of the adapters nobody on rank 0 holds any more.
  void drop_released_adapters() {
    std::map<uint64_t, std::weak_ptr<const LoraAdapter>>& sent = shared_->sent;
    std::vector<uint64_t> gone;
    for (auto it = sent.begin(); it != sent.end();)
      if (it->second.expired()) {
        gone.push_back(it->first);
        it = sent.erase(it);
      } else {
        ++it;
      }
    if (gone.empty()) return;
    std::vector<uint8_t> payload = with_model_id(id_, gone.data(), gone.size() * sizeof(uint64_t));
    broadcast_message(MsgKind::DropAdapters, std::move(payload));
  }

  std::shared_ptr<SharedModel> shared_;
  uint64_t id_;   // what the ranks know this model by
  Model& local_;  // rank 0's part (executor().parts[id_])
};

}  // namespace

std::unique_ptr<Model> load_parallel_model(std::shared_ptr<const GgufFile> file, const ParallelLayout& layout,
                                           int n_threads) {
  Comm& w = world();
  check_layout(layout, read_hparams(*file), file->path(), w.size());
  Executor& ex = executor();
  const std::string& path = file->path();
  LoadRequest lr{};
  Part* part = nullptr;
  {  // A turn to start the load on every rank...
    std::lock_guard lock(turn_mutex());
    if (g_active && !(layout == ex.layout))
      fail(path, ": a model split otherwise than the one loaded (every model of a job has its layout)");
    lr = LoadRequest{ex.next_model_id++, layout.tp, layout.pp, layout.micro_batches, n_threads, fingerprint(*file),
                     file->file_size()};
    std::vector<uint8_t> req(sizeof(LoadRequest) + path.size());
    std::memcpy(req.data(), &lr, sizeof lr);
    std::memcpy(req.data() + sizeof lr, path.data(), path.size());
    broadcast_message(MsgKind::Load, std::move(req));
    part = &ex.begin_load(lr.model_id, layout);
  }
  // ... this rank's part loaded outside the turns, as every other rank loads its own in the
  // background: the models already loaded keep running steps (a live base swap's old base) ...
  const std::string error = ex.load_part(*part, path, file, lr.fingerprint, lr.file_size);
  // ... and a turn to end it.
  std::lock_guard lock(turn_mutex());
  std::vector<uint8_t> done = with_model_id(lr.model_id, nullptr, 0);
  broadcast_message(MsgKind::LoadDone, std::move(done));
  std::vector<RankInfo> infos = gather_load_status(lr.model_id, error);
  {
    std::lock_guard infos_lock(g_infos_mutex);
    g_infos = std::move(infos);
  }
  g_active = true;
  return std::make_unique<ParallelModel>(std::make_shared<SharedModel>(lr.model_id));
}

std::unique_ptr<Model> share_parallel_model(const Model& model) {
  const auto* view = dynamic_cast<const ParallelModel*>(&model);
  if (!view) fail("share_parallel_model: not a model of load_parallel_model");
  return view->another_view();
}

int worker_main() {
  // A worker follows rank 0: it exits when rank 0 releases it, after rank 0's own graceful
  // shutdown (mpirun passes SIGINT / SIGTERM to every rank; were the workers to die of it, mpirun
  // would end the job before rank 0 had finished its requests). Should rank 0 die, mpirun kills
  // the workers outright.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  Comm& w = world();
  Executor& ex = executor();
  std::unique_ptr<ThreadPool> pool;
  // Loads under way (between Load and LoadDone): each rank's part loads on a thread of its own
  // while this one serves the other models' steps.
  struct PendingLoad {
    std::thread thread;
    std::string error;
  };
  std::map<uint64_t, std::unique_ptr<PendingLoad>> loading;
  const auto finish_loads = [&] {
    for (auto& [id, l] : loading) l->thread.join();
    loading.clear();
  };
  // Model `id`'s part, and the id a message about it starts with.
  // The model id a message starts with (`whole`: the message is nothing else).
  const auto model_id = [](const std::vector<uint8_t>& bytes, const char* what, bool whole) {
    uint64_t id = 0;
    if (bytes.size() < sizeof id || (whole && bytes.size() != sizeof id)) fail("malformed ", what);
    std::memcpy(&id, bytes.data(), sizeof id);
    return id;
  };
  const auto model_of = [&](const std::vector<uint8_t>& bytes, const char* what) -> std::pair<uint64_t, Part*> {
    const uint64_t id = model_id(bytes, what, false);
    return {id, &ex.part(id, what)};
  };
  // This rank's arena of model `p` for rank 0's `id` (made, or made again when its size or type
  // changed).
  const auto arena = [&](Part& p, uint64_t id, int64_t n_slots, KvType type) -> KvStore& {
    auto it = p.kvs.find(id);
    if (it == p.kvs.end() || it->second.n_slots() != n_slots || it->second.type() != type) {
      if (it != p.kvs.end()) p.kvs.erase(it);
      it = p.kvs.emplace(id, make_kv_store(p.model->hparams(), n_slots, type)).first;
    }
    return it->second;
  };
  std::vector<uint8_t> payload;
  try {
    for (;;) {
      MsgHeader h{};
      w.recv(&h, sizeof h, 0, kTagMessage);
      if (h.bytes < 0 || h.bytes > (int64_t(1) << 31)) fail("malformed message from rank 0 (", h.bytes, " bytes)");
      payload.resize(size_t(h.bytes));
      if (h.bytes > 0) w.recv(payload.data(), h.bytes, 0, kTagMessage + 1);
      switch (h.kind) {
        case MsgKind::Exit:
          finish_loads();
          ex.wait_sends();
          return 0;
        case MsgKind::Load: {
          LoadRequest lr;
          if (payload.size() < sizeof lr) fail("malformed load request");
          std::memcpy(&lr, payload.data(), sizeof lr);
          // Rank 0's path, or this node's copy of the model where it lives elsewhere.
          std::string path(reinterpret_cast<const char*>(payload.data()) + sizeof lr, payload.size() - sizeof lr);
          if (const char* own = std::getenv("TERN_RANK_MODEL"); own && *own) path = own;
          const int n_threads = lr.n_threads > 0 ? lr.n_threads : default_thread_count();
          if (!pool || pool->size() != n_threads) pool = std::make_unique<ThreadPool>(n_threads);
          if (loading.count(lr.model_id) || ex.parts.count(lr.model_id)) fail("model ", lr.model_id, " loaded twice");
          Part& part = ex.begin_load(lr.model_id, ParallelLayout{lr.tp, lr.pp, lr.micro_batches});
          auto l = std::make_unique<PendingLoad>();
          PendingLoad* at = l.get();
          at->thread = std::thread([&ex, &part, at, path, lr] {
            at->error = ex.load_part(part, path, nullptr, lr.fingerprint, lr.file_size);
          });
          loading.emplace(lr.model_id, std::move(l));
          break;
        }
        case MsgKind::LoadDone: {
          const uint64_t id = model_id(payload, "end of a load", true);
          const auto it = loading.find(id);
          if (it == loading.end()) fail("the end of a load of model ", id, ", which was not started");
          it->second->thread.join();
          const std::string error = it->second->error;
          loading.erase(it);
          gather_load_status(id, error);
          break;
        }
        case MsgKind::Unload: {
          ex.parts.erase(model_id(payload, "unload request", true));
          break;
        }
        case MsgKind::Step: {
          const auto [id, part] = model_of(payload, "step");
          StepPlan plan = decode_step(std::span<const uint8_t>(payload).subspan(sizeof id));
          // Each sequence's adapters, as rank 0 sent them (LoraSets live until the step is done).
          std::vector<LoraSet> sets(plan.seqs.size());
          for (size_t i = 0; i < plan.seqs.size(); ++i) {
            for (const LoraRef& ref : plan.lora[i]) {
              const auto it = part->adapters.find(ref.uid);
              if (it == part->adapters.end()) fail("a step names LoRA adapter ", ref.uid, ", which rank 0 never sent");
              sets[i].push_back(LoraUse{it->second, ref.scale});
            }
            if (!sets[i].empty()) plan.seqs[i].lora = &sets[i];
          }
          ex.run_with_key_masses(*part->model, plan.seqs, plan.key_mass, {},
                                 arena(*part, plan.kv_id, plan.kv_slots, plan.kv_type), nullptr, *pool);
          break;
        }
        case MsgKind::Adapter: {
          AdapterRequest req;
          if (payload.size() < sizeof req) fail("malformed adapter message");
          std::memcpy(&req, payload.data(), sizeof req);
          if (req.name_bytes < 0 || req.name_bytes > int64_t(payload.size() - sizeof req)) fail("malformed adapter message");
          const std::string name(reinterpret_cast<const char*>(payload.data()) + sizeof req, size_t(req.name_bytes));
          std::string error;
          std::shared_ptr<const LoraAdapter> adapter;
          Part* part = nullptr;
          try {
            part = &ex.part(req.model_id, "an adapter");
            const size_t at = sizeof req + size_t(req.name_bytes);
            auto bytes = std::make_shared<std::vector<uint8_t>>(payload.begin() + std::ptrdiff_t(at), payload.end());
            const GgufFile file = GgufFile::parse(bytes, bytes->data(), bytes->size(), name);
            adapter = LoraAdapter::from_file(file);
            part->model->check_lora(*adapter);
          } catch (const std::exception& e) {
            error = e.what();
          }
          if (first_error(error).empty()) part->adapters[req.uid] = std::move(adapter);
          break;
        }
        case MsgKind::DropAdapters: {
          const auto [id, part] = model_of(payload, "adapter release");
          if ((payload.size() - sizeof id) % sizeof(uint64_t) != 0) fail("malformed adapter release");
          for (size_t at = sizeof id; at < payload.size(); at += sizeof(uint64_t)) {
            uint64_t uid;
            std::memcpy(&uid, payload.data() + at, sizeof uid);
            part->adapters.erase(uid);
          }
          break;
        }
        case MsgKind::CopySlots: {
          const auto c = kv_request<CopySlotsRequest>(payload, "copy of K/V slots");
          Part& part = ex.part(c.model_id, "a copy of K/V slots");
          KvStore& kv = arena(part, c.kv_id, c.kv_slots, KvType(c.kv_type));
          if (c.src < 0 || c.dst < 0 || c.n < 0 || c.src + c.n > kv.n_slots() || c.dst + c.n > kv.n_slots())
            fail("copy of K/V slots out of range");
          kv.copy_slots(c.src, c.dst, c.n);
          break;
        }
        case MsgKind::SinkKeys: {
          const auto r = kv_request<SinkKeysRequest>(payload, "sink keys request");
          Part& part = ex.part(r.model_id, "a sink keys request");
          KvStore& kv = arena(part, r.kv_id, r.kv_slots, KvType(r.kv_type));
          if (r.slot < 0 || r.slot >= kv.n_slots() || int32_t(r.op) < 0 || int32_t(r.op) > 2)
            fail("sink keys request out of range");
          if (r.op == SinkOp::Place && kv.pinned_keys(r.slot).empty()) fail("sink keys placed before they were kept");
          apply_sink_op(*part.model, kv, r);
          break;
        }
        case MsgKind::Timeline:
          ex.exchange_timeline();
          break;
        case MsgKind::Job:
          serve_job(std::string(payload.begin(), payload.end()));
          break;
        default:
          fail("unknown message ", int(h.kind), " from rank 0");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tern: rank %d: error: %s\n", w.rank(), e.what());
    std::fflush(stderr);
    abort_all(1);
  }
}

void announce_job(const std::string& message) {
  std::lock_guard lock(turn_mutex());
  std::vector<uint8_t> payload(message.begin(), message.end());
  broadcast_message(MsgKind::Job, std::move(payload));
}

void release_workers() {
  std::lock_guard lock(turn_mutex());
  if (g_released || world().size() == 1 || world().rank() != 0) return;
  g_released = true;
  broadcast_message(MsgKind::Exit);
  flush_outbox();
}

std::vector<RankInfo> rank_infos() {
  std::lock_guard lock(g_infos_mutex);
  return g_infos;
}
const ParallelLayout* active_layout() { return g_active ? &executor().layout : nullptr; }

std::vector<BusyInterval> collect_timeline() {
  if (world().rank() != 0) return {};
  std::lock_guard lock(turn_mutex());
  if (world().size() > 1) broadcast_message(MsgKind::Timeline);
  return executor().exchange_timeline();
}

}  // namespace tern::dist
