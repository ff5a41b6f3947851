// FramedSocket: a non-blocking TCP connection carrying typed, length-prefixed frames (the rendezvous and
// control-channel protocol), plus listening and connecting with deadlines. POSIX sockets; never blocks past
// a deadline and never raises SIGPIPE.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megatune::executor {

using SteadyClock = std::chrono::steady_clock;

enum class FrameType : std::uint8_t {
  kHello = 1,    // rank -> rank 0: rank, world size, fingerprint
  kWelcome = 2,  // rank 0 -> rank: the blob
  kError = 3,    // rank 0 -> rank: the rendezvous failed (message)
  kAbort = 4,    // either way, after the rendezvous: the job failed (message)
  kGoodbye = 5,  // either way: closing normally
};

struct Frame {
  FrameType type = FrameType::kHello;
  std::string payload;
};

class FramedSocket {
 public:
  FramedSocket(int fd, std::string peer_name);  // owns fd; makes it non-blocking
  ~FramedSocket();
  FramedSocket(const FramedSocket&) = delete;
  FramedSocket& operator=(const FramedSocket&) = delete;

  int fd() const { return fd_; }
  const std::string& peer_name() const { return peer_name_; }  // "host:port"

  // Sends one frame, waiting for buffer space until `deadline`; false when the peer is gone or the
  // deadline passed.
  bool send(FrameType type, const std::string& payload, SteadyClock::time_point deadline);
  enum class ReadStatus { kOpen, kClosed, kGarbage };
  // Appends the complete frames the socket holds now (no waiting). kClosed: the peer closed or the
  // connection broke; kGarbage: bytes that are no megatune frame (another program on the port).
  ReadStatus read_available(std::vector<Frame>& frames);

 private:
  int fd_;
  std::string peer_name_;
  std::string inbox_;
};

// A listening socket on every interface (IPv6 and IPv4) at `port`; -1 and `error` set on failure.
int listen_on_port(int port, std::string* error);
// The next pending connection on `listen_fd`, or null when none is waiting.
std::unique_ptr<FramedSocket> accept_pending(int listen_fd);
// Connects to host:port, retrying every `retry_s` until `deadline`; null (and `last_error` set) when the
// deadline passed. Throws a UserError when `host` does not resolve.
std::unique_ptr<FramedSocket> connect_until(const std::string& host, int port, double retry_s,
                                            SteadyClock::time_point deadline, std::string* last_error);
// Waits until one of `fds` is readable (or has hung up) or `timeout_ms` passed.
void wait_readable(const std::vector<int>& fds, int timeout_ms);
// Milliseconds from now to `deadline`, clamped to [0, cap_ms].
int milliseconds_until(SteadyClock::time_point deadline, int cap_ms);
SteadyClock::time_point deadline_after(double seconds);

}  // namespace megatune::executor
