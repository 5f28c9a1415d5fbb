#pragma once
// The communicator tern's parallel layouts run on (docs/distributed.md): one process per rank,
// launched with `mpirun`, over Open MPI. One thread at a time talks to MPI (the thread pools'
// workers never do; tern serve's engine thread does), so MPI is initialised at
// MPI_THREAD_SERIALIZED.
//
// Built without MPI (no libopenmpi-dev at configure time), or run without `mpirun`, the world is
// one rank and every collective is a copy: the single-process path never needs MPI at run time.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tern::dist {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // x[0 .. n) := the sum over ranks of x, added in rank order (x_0 + x_1 + ...), so that every
  // rank gets the same bits whatever algorithm MPI would have chosen for MPI_Allreduce.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  // recv[r * bytes ...] := rank r's `send` (bytes each).
  virtual void all_gather(const void* send, int64_t bytes, void* recv) = 0;
  // buf := root's buf.
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void send(const void* buf, int64_t bytes, int dst, int tag) = 0;
  virtual void recv(void* buf, int64_t bytes, int src, int tag) = 0;
  // Non-blocking point-to-point: each returns at once with a handle; the buffer stays untouched
  // until test() says the operation is done (or wait() returns). Messages between two ranks with
  // one tag arrive in the order they were sent, and receives posted for one source and tag match
  // them in the order they were posted (MPI's non-overtaking rule): what lets several steps be in
  // flight with the same tags.
  using Request = uint64_t;
  virtual Request isend(const void* buf, int64_t bytes, int dst, int tag) = 0;
  virtual Request irecv(void* buf, int64_t bytes, int src, int tag) = 0;
  // isend of `buf` to every other rank (one added latency, as a broadcast's): a broadcast that
  // never waits for its receivers.
  virtual std::vector<Request> isend_all(const void* buf, int64_t bytes, int tag) = 0;
  // Whether `r` is done (it is then forgotten: test or wait it no more). Drives MPI's progress.
  virtual bool test(Request r) = 0;
  virtual void wait(Request r) = 0;
  virtual void barrier() = 0;
  // The ranks with the same `color`, ordered by `key` (MPI_Comm_split). Collective.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
};

// Whether tern was built with MPI.
bool built_with_mpi();
// Whether this process was started by mpirun (Open MPI's or a PMI launcher's environment).
bool launched_by_mpirun();
// Initialises MPI when launched by mpirun (and built with it); a no-op otherwise. Once, before
// any other call here.
void init(int* argc, char*** argv);
// MPI_Finalize when init() started MPI.
void finalize();
// Ends every rank's process at once (MPI_Abort): what a rank does after a failure it cannot
// report through the protocol, so that no other rank waits for it forever.
[[noreturn]] void abort_all(int code);
// All processes of the job (a one-rank stand-in when not under mpirun).
Comm& world();

// Seconds of added one-way latency for every message (TERN_COMM_LATENCY_US, microseconds): the
// simulated-network tests' option for what `tc` cannot add on machines without netem.
double injected_latency_s();

}  // namespace tern::dist
