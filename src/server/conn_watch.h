#pragma once
// Seeing a client go away while its request is still generating.
//
// cpp-httplib 0.11 (Debian 12's) gives a handler neither the socket nor a "connection closed"
// query, and a write to a socket whose peer has closed succeeds once before it fails, so a
// waiting request (queued, or between tokens) would keep its KV blocks until the next two
// writes. The handler does know both ends' addresses, and the worker thread keeps the socket
// open while the handler runs, so the socket can be found once by those addresses and then
// polled for the peer's FIN/RST between tokens.
#include <string>

namespace tern::server {

class ConnWatch {
 public:
  ConnWatch() = default;
  // Finds the socket whose local and peer addresses are these (as httplib reports them:
  // numeric host strings). Not found (fd() < 0): closed() is always false.
  ConnWatch(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

  int fd() const { return fd_; }
  // True when the peer has closed or reset the connection. Data waiting to be read (a
  // pipelined request) does not count; a peer that half-closes (shutdown(SHUT_WR)) after its
  // request reads as gone, which HTTP clients do not do. Never blocks.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace tern::server
