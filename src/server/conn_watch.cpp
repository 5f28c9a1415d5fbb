#include "server/conn_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace tern::server {

namespace {

// Numeric host and port of a socket address, the way httplib prints them (getnameinfo with
// NI_NUMERICHOST).
bool host_port(const sockaddr_storage& sa, socklen_t len, std::string* host, int* port) {
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&sa), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  *host = buf;
  if (sa.ss_family == AF_INET) *port = ntohs(reinterpret_cast<const sockaddr_in*>(&sa)->sin_port);
  else if (sa.ss_family == AF_INET6) *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&sa)->sin6_port);
  else return false;
  return true;
}

}  // namespace

ConnWatch::ConnWatch(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t plen = sizeof peer, slen = sizeof self;
    // Cheap rejections first: most fds are not connected sockets.
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    std::string host;
    int port = -1;
    if (!host_port(peer, plen, &host, &port) || port != remote_port || host != remote_addr) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &slen) != 0) continue;
    if (!host_port(self, slen, &host, &port) || port != local_port || host != local_addr) continue;
    fd_ = int(fd);
    break;
  }
  closedir(dir);
}

bool ConnWatch::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    // 0: orderly shutdown by the peer; > 0: the client sent more (pipelining), still there.
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
  }
  return false;
}

}  // namespace tern::server
