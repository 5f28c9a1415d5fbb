#pragma once
// Seeing a client go away while its request is still generating: a waiting request (queued,
// or between tokens) polls its socket so that a vanished client's KV blocks are freed at once
// rather than at the next failed write.
namespace tern::server {

class ConnWatch {
 public:
  ConnWatch() = default;
  explicit ConnWatch(int fd) : fd_(fd) {}

  int fd() const { return fd_; }
  // True when the peer has closed or reset the connection. Data waiting to be read (a
  // pipelined request) does not count; a peer that half-closes (shutdown(SHUT_WR)) after its
  // request reads as gone, which HTTP clients do not do. Never blocks. Without a socket
  // (fd() < 0), always false.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace tern::server
