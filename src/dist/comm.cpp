#include "dist/comm.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"

#ifdef TERN_HAVE_MPI
#include <mpi.h>
#endif

namespace tern::dist {
namespace {

// One rank alone: collectives are copies, and point-to-point has no partner.
class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_gather(const void* send, int64_t bytes, void* recv) override { std::memcpy(recv, send, size_t(bytes)); }
  void broadcast(void*, int64_t, int) override {}
  void send(const void*, int64_t, int, int) override { fail("send: a one-rank world has no other rank"); }
  void recv(void*, int64_t, int, int) override { fail("recv: a one-rank world has no other rank"); }
  Request isend(const void*, int64_t, int, int) override { fail("send: a one-rank world has no other rank"); }
  Request irecv(void*, int64_t, int, int) override { fail("recv: a one-rank world has no other rank"); }
  std::vector<Request> isend_all(const void*, int64_t, int) override { return {}; }
  bool test(Request) override { return true; }
  void wait(Request) override {}
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) override { return std::make_unique<SoloComm>(); }
};

[[maybe_unused]] void inject_latency() {
  const double s = injected_latency_s();
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

#ifdef TERN_HAVE_MPI
bool g_mpi_started = false;

int checked_count(int64_t bytes) {
  TERN_ASSERT_MSG(bytes >= 0 && bytes < (int64_t(1) << 31), "MPI message over 2 GiB");
  return int(bytes);
}

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm_(c) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD && g_mpi_started) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* x, int64_t n) override {
    if (size_ == 1) return;
    gathered_.resize(size_t(n) * size_t(size_));
    all_gather(x, n * int64_t(sizeof(float)), gathered_.data());
    // In rank order on every rank: the same bits everywhere.
    std::memcpy(x, gathered_.data(), size_t(n) * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* p = gathered_.data() + size_t(r) * size_t(n);
      for (int64_t i = 0; i < n; ++i) x[i] += p[i];
    }
  }
  void all_gather(const void* send, int64_t bytes, void* recv) override {
    inject_latency();
    MPI_Allgather(send, checked_count(bytes), MPI_BYTE, recv, checked_count(bytes), MPI_BYTE, comm_);
  }
  void broadcast(void* buf, int64_t bytes, int root) override {
    if (rank_ == root) inject_latency();
    MPI_Bcast(buf, checked_count(bytes), MPI_BYTE, root, comm_);
  }
  void send(const void* buf, int64_t bytes, int dst, int tag) override {
    inject_latency();
    MPI_Send(buf, checked_count(bytes), MPI_BYTE, dst, tag, comm_);
  }
  void recv(void* buf, int64_t bytes, int src, int tag) override {
    MPI_Recv(buf, checked_count(bytes), MPI_BYTE, src, tag, comm_, MPI_STATUS_IGNORE);
  }
  Request isend(const void* buf, int64_t bytes, int dst, int tag) override {
    inject_latency();
    MPI_Request r;
    MPI_Isend(buf, checked_count(bytes), MPI_BYTE, dst, tag, comm_, &r);
    return remember(r);
  }
  std::vector<Request> isend_all(const void* buf, int64_t bytes, int tag) override {
    inject_latency();
    std::vector<Request> out;
    for (int dst = 0; dst < size_; ++dst)
      if (dst != rank_) {
        MPI_Request r;
        MPI_Isend(buf, checked_count(bytes), MPI_BYTE, dst, tag, comm_, &r);
        out.push_back(remember(r));
      }
    return out;
  }
  Request irecv(void* buf, int64_t bytes, int src, int tag) override {
    MPI_Request r;
    MPI_Irecv(buf, checked_count(bytes), MPI_BYTE, src, tag, comm_, &r);
    return remember(r);
  }
  bool test(Request id) override {
    const auto it = pending_.find(id);
    TERN_ASSERT_MSG(it != pending_.end(), "test of an unknown request");
    int done = 0;
    MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
    if (done) pending_.erase(it);
    return done != 0;
  }
  void wait(Request id) override {
    const auto it = pending_.find(id);
    TERN_ASSERT_MSG(it != pending_.end(), "wait for an unknown request");
    MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    pending_.erase(it);
  }
  void barrier() override { MPI_Barrier(comm_); }
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm c;
    MPI_Comm_split(comm_, color, key, &c);
    return std::make_unique<MpiComm>(c);
  }

 private:
  Request remember(MPI_Request r) {
    pending_.emplace(++last_request_, r);
    return last_request_;
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_;
  std::map<Request, MPI_Request> pending_;  // isend / irecv not yet done
  Request last_request_ = 0;
};
#endif

std::unique_ptr<Comm>& world_ptr() {
  static std::unique_ptr<Comm> w;
  return w;
}

}  // namespace

bool built_with_mpi() {
#ifdef TERN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

void init(int* argc, char*** argv) {
  (void)argc, (void)argv;
#ifdef TERN_HAVE_MPI
  if (launched_by_mpirun() && !g_mpi_started) {
    // A pipeline stage sends a micro-batch's activations (MPI_Isend) and computes the next one
    // without calling MPI: over TCP a message past the eager limit (64 KiB by default) waits
    // for the sender's next MPI call, so the stages would not overlap. Up to 16 MiB go eagerly
    // unless the user set these (mpirun --mca, or OMPI_MCA_* in the environment).
    for (const char* key : {"OMPI_MCA_btl_tcp_eager_limit", "OMPI_MCA_btl_tcp_rndv_eager_limit",
                            "OMPI_MCA_btl_tcp_max_send_size"})
      ::setenv(key, "16777216", /*overwrite=*/0);
    int provided = 0;
    // SERIALIZED: one thread at a time, but not always the main one (tern serve's engine loop
    // runs the steps on its own thread).
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    g_mpi_started = true;
    world_ptr() = std::make_unique<MpiComm>(MPI_COMM_WORLD);
  }
#endif
}

void finalize() {
#ifdef TERN_HAVE_MPI
  if (g_mpi_started) {
    world_ptr().reset();
    MPI_Finalize();
    g_mpi_started = false;
  }
#endif
}

void abort_all(int code) {
#ifdef TERN_HAVE_MPI
  if (g_mpi_started) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

Comm& world() {
  if (!world_ptr()) world_ptr() = std::make_unique<SoloComm>();
  return *world_ptr();
}

double injected_latency_s() {
  static const double s = [] {
    const char* v = std::getenv("TERN_COMM_LATENCY_US");
    return v && *v ? std::atof(v) * 1e-6 : 0.0;
  }();
  return s;
}

}  // namespace tern::dist
