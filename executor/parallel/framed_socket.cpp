// FramedSocket and the deadline-bounded listen / accept / connect of the rendezvous. A frame is the magic
// "MGTN", one type byte, a big-endian u32 payload length and the payload.
#include "executor/parallel/framed_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/user_error.h"

namespace megatune::executor {
namespace {

constexpr char kMagic[4] = {'M', 'G', 'T', 'N'};
constexpr std::size_t kHeaderBytes = 9;
constexpr std::uint32_t kMaxPayloadBytes = 16u << 20;

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string address_name(const sockaddr* address) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  const socklen_t length =
      address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : static_cast<socklen_t>(sizeof(sockaddr_in));
  getnameinfo(address, length, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  std::string name = host;
  if (name.rfind("::ffff:", 0) == 0 && name.find('.') != std::string::npos) name.erase(0, 7);  // IPv4 peer
  return name + ":" + port;
}

// One non-blocking connection attempt to `info`, waiting at most until `deadline`; the fd or -1.
int try_connect(const addrinfo* info, SteadyClock::time_point deadline, std::string* error) {
  const int fd = socket(info->ai_family, info->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, info->ai_protocol);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  if (connect(fd, info->ai_addr, info->ai_addrlen) == 0) return fd;
  if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, milliseconds_until(deadline, 1000)) == 1) {
      int status = 0;
      socklen_t length = sizeof(status);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &status, &length);
      if (status == 0) return fd;
      errno = status;
    } else {
      errno = ETIMEDOUT;
    }
  }
  *error = std::strerror(errno);
  ::close(fd);
  return -1;
}

}  // namespace

SteadyClock::time_point deadline_after(double seconds) {
  return SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                  std::chrono::duration<double>(std::max(0.0, seconds)));
}

int milliseconds_until(SteadyClock::time_point deadline, int cap_ms) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap_ms));
}

void wait_readable(const std::vector<int>& fds, int timeout_ms) {
  std::vector<pollfd> polls;
  for (int fd : fds) polls.push_back(pollfd{fd, POLLIN, 0});
  if (polls.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return;
  }
  poll(polls.data(), polls.size(), timeout_ms);
}

FramedSocket::FramedSocket(int fd, std::string peer_name) : fd_(fd), peer_name_(std::move(peer_name)) {
  set_nonblocking(fd_);
}

FramedSocket::~FramedSocket() { ::close(fd_); }

bool FramedSocket::send(FrameType type, const std::string& payload, SteadyClock::time_point deadline) {
  std::string bytes(kMagic, sizeof(kMagic));
  bytes.push_back(static_cast<char>(type));
  const std::uint32_t length = htonl(static_cast<std::uint32_t>(payload.size()));
  bytes.append(reinterpret_cast<const char*>(&length), sizeof(length));
  bytes += payload;
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (SteadyClock::now() >= deadline) return false;
      poll(&p, 1, milliseconds_until(deadline, 100));
      continue;
    }
    return false;
  }
  return true;
}

FramedSocket::ReadStatus FramedSocket::read_available(std::vector<Frame>& frames) {
  ReadStatus status = ReadStatus::kOpen;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n > 0) {
      inbox_.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) status = ReadStatus::kClosed;
    break;
  }
  while (inbox_.size() >= kHeaderBytes) {
    if (std::memcmp(inbox_.data(), kMagic, sizeof(kMagic)) != 0) return ReadStatus::kGarbage;
    std::uint32_t length = 0;
    std::memcpy(&length, inbox_.data() + 5, sizeof(length));
    length = ntohl(length);
    const auto type = static_cast<std::uint8_t>(inbox_[4]);
    if (length > kMaxPayloadBytes || type < 1 || type > 5) return ReadStatus::kGarbage;
    if (inbox_.size() < kHeaderBytes + length) break;
    frames.push_back(Frame{static_cast<FrameType>(type), inbox_.substr(kHeaderBytes, length)});
    inbox_.erase(0, kHeaderBytes + length);
  }
  if (status == ReadStatus::kOpen && inbox_.size() >= sizeof(kMagic) &&
      std::memcmp(inbox_.data(), kMagic, sizeof(kMagic)) != 0)
    return ReadStatus::kGarbage;
  return status;
}

int listen_on_port(int port, std::string* error) {
  for (const int family : {AF_INET6, AF_INET}) {
    const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      auto* a = reinterpret_cast<sockaddr_in6*>(&address);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<std::uint16_t>(port));
      length = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&address);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<std::uint16_t>(port));
      length = sizeof(sockaddr_in);
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 && listen(fd, 1024) == 0) return fd;
    const int failure = errno;
    *error = std::strerror(failure);
    ::close(fd);
    if (failure == EADDRINUSE) return -1;  // the IPv4 attempt would fail alike
  }
  return -1;
}

std::unique_ptr<FramedSocket> accept_pending(int listen_fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC);
  if (fd < 0) return nullptr;
  return std::make_unique<FramedSocket>(fd, address_name(reinterpret_cast<sockaddr*>(&address)));
}

std::unique_ptr<FramedSocket> connect_until(const std::string& host, int port, double retry_s,
                                            SteadyClock::time_point deadline, std::string* last_error) {
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* infos = nullptr;
    const int resolved = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &infos);
    if (resolved == EAI_NONAME || resolved == EAI_SERVICE || resolved == EAI_FAIL)
      throw UserError("MASTER_ADDR=" + host + ": " + gai_strerror(resolved) +
                      "; set MASTER_ADDR to rank 0's host name or address");
    if (resolved != 0) *last_error = gai_strerror(resolved);
    for (const addrinfo* info = resolved == 0 ? infos : nullptr; info != nullptr; info = info->ai_next) {
      const int fd = try_connect(info, deadline, last_error);
      if (fd >= 0) {
        std::string name = address_name(info->ai_addr);
        freeaddrinfo(infos);
        return std::make_unique<FramedSocket>(fd, std::move(name));
      }
    }
    if (infos != nullptr) freeaddrinfo(infos);
    if (SteadyClock::now() >= deadline) return nullptr;
    std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds_until(deadline, int(retry_s * 1000))));
  }
}

}  // namespace megatune::executor
