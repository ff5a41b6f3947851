// TcpRendezvous: rank 0 gathers every rank's hello, checks it and answers with the blob or with the one
// line that ends the job; afterwards the same connections carry aborts and goodbyes.
#include "executor/parallel/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "base/user_error.h"
#include "executor/parallel/framed_socket.h"

namespace megatune::executor {
namespace {

constexpr double kSendTimeoutS = 2.0;
constexpr double kVerdictGraceS = 5.0;  // how much longer a connected rank waits than rank 0 does
constexpr int kPollSliceMs = 100;

struct Hello {
  int rank = -1, world_size = 0;
  std::string fingerprint;
};

void append_int(std::string& bytes, int value) {
  const std::uint32_t big_endian = htonl(static_cast<std::uint32_t>(value));
  bytes.append(reinterpret_cast<const char*>(&big_endian), sizeof(big_endian));
}

int read_int(const std::string& bytes, std::size_t offset) {
  std::uint32_t big_endian = 0;
  std::memcpy(&big_endian, bytes.data() + offset, sizeof(big_endian));
  return static_cast<int>(ntohl(big_endian));
}

std::string encode_hello(const Hello& hello) {
  std::string bytes;
  append_int(bytes, hello.rank);
  append_int(bytes, hello.world_size);
  return bytes + hello.fingerprint;
}

std::optional<Hello> decode_hello(const std::string& bytes) {
  if (bytes.size() < 8) return std::nullopt;
  return Hello{read_int(bytes, 0), read_int(bytes, 4), bytes.substr(8)};
}

// "3, 5-7" from ascending ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

std::string shortened(const std::string& text) {
  return text.size() <= 60 ? "'" + text + "'" : "'" + text.substr(0, 57) + "...'";
}

// A connection that reached rank 0, before and after its hello.
struct Arrival {
  std::unique_ptr<FramedSocket> socket;
  std::optional<Hello> hello;
  bool told = false;  // got rank 0's verdict
};

// Rank 0's bookkeeping of the ranks that said hello.
class Roll {
 public:
  Roll(int world_size, std::string fingerprint)
      : world_size_(world_size), fingerprint_(std::move(fingerprint)), arrival_of_(world_size, -1) {}

  // Why `hello` (from arrival `index`) cannot join, or nullopt after enrolling it.
  std::optional<std::string> enroll(const Hello& hello, int index, const std::vector<Arrival>& arrivals) {
    const std::string who =
        "rank " + std::to_string(hello.rank) + " (" + arrivals[index].socket->peer_name() + ")";
    if (hello.world_size != world_size_)
      return who + " was started for " + std::to_string(hello.world_size) + " processes but rank 0 for " +
             std::to_string(world_size_) +
             ": give every rank the same WORLD_SIZE / SLURM_NTASKS / OMPI_COMM_WORLD_SIZE";
    if (hello.rank <= 0 || hello.rank >= world_size_ || arrival_of_[hello.rank] >= 0) {
      const std::string other = hello.rank > 0 && hello.rank < world_size_
                                    ? arrivals[arrival_of_[hello.rank]].socket->peer_name()
                                    : std::string("rank 0 itself");
      return "two processes claim rank " + std::to_string(hello.rank) + " (" + other + " and " +
             arrivals[index].socket->peer_name() +
             "): give every process its own RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK";
    }
    if (hello.fingerprint != fingerprint_)
      return who + " runs a different configuration than rank 0 (" + shortened(hello.fingerprint) + " vs " +
             shortened(fingerprint_) + "): start every rank with the same command line and files";
    arrival_of_[hello.rank] = index;
    return std::nullopt;
  }
  void leave(int rank) { arrival_of_[rank] = -1; }
  int arrival_of(int rank) const { return arrival_of_[rank]; }
  std::vector<int> missing() const {
    std::vector<int> ranks;
    for (int r = 1; r < world_size_; ++r)
      if (arrival_of_[r] < 0) ranks.push_back(r);
    return ranks;
  }

 private:
  int world_size_;
  std::string fingerprint_;
  std::vector<int> arrival_of_;  // rank -> index into the arrivals (-1: not here)
};

class ListenSocket {
 public:
  explicit ListenSocket(int fd) : fd_(fd) {}
  ~ListenSocket() { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

TcpRendezvous::TcpRendezvous(const LaunchEnvironment& launch, const RendezvousOptions& options,
                             const std::string& blob_on_rank0)
    : rank_(launch.rank),
      world_size_(launch.world_size),
      master_addr_(launch.master_addr),
      master_port_(launch.master_port) {
  if (world_size_ == 1) {
    blob_ = blob_on_rank0;
    return;
  }
  peers_.resize(rank_ == 0 ? world_size_ : 1);
  if (rank_ == 0)
    run_rank0(options, blob_on_rank0);
  else
    run_member(options);
}

TcpRendezvous::~TcpRendezvous() { close(); }

std::string TcpRendezvous::endpoint() const { return master_addr_ + ":" + std::to_string(master_port_); }

void TcpRendezvous::run_rank0(const RendezvousOptions& options, const std::string& blob) {
  const std::string where = "rendezvous at " + endpoint() + ": ";
  std::string error;
  const int fd = listen_on_port(master_port_, &error);
  if (fd < 0)
    throw UserError(where + "rank 0 cannot listen on port " + std::to_string(master_port_) + " (" + error +
                    "); set MASTER_PORT to a free port");
  const ListenSocket listener(fd);
  const SteadyClock::time_point deadline = deadline_after(options.timeout_s);
  SteadyClock::time_point linger_end = deadline;
  std::vector<Arrival> arrivals;
  Roll roll(world_size_, options.fingerprint);
  std::optional<std::string> failure;
  for (;;) {
    while (std::unique_ptr<FramedSocket> socket = accept_pending(listener.fd()))
      arrivals.push_back(Arrival{std::move(socket)});
    for (int i = 0; i < int(arrivals.size()); ++i) {
      Arrival& a = arrivals[i];
      if (!a.socket) continue;
      std::vector<Frame> frames;
      const FramedSocket::ReadStatus status = a.socket->read_available(frames);
      for (const Frame& frame : frames) {
        if (frame.type != FrameType::kHello || a.hello) continue;
        a.hello = decode_hello(frame.payload);
        if (a.hello && !failure) {
          failure = roll.enroll(*a.hello, i, arrivals);
          if (failure) linger_end = std::min(deadline, deadline_after(options.error_linger_s));
        }
      }
      if (status != FramedSocket::ReadStatus::kOpen) {  // gone, or not one of ours
        if (a.hello && a.hello->rank > 0 && a.hello->rank < world_size_ &&
            roll.arrival_of(a.hello->rank) == i)
          roll.leave(a.hello->rank);
        a.socket.reset();
      }
    }
    const std::vector<int> missing = roll.missing();
    if (!failure && missing.empty()) break;
    if (!failure && SteadyClock::now() >= deadline) {
      failure = where + "timed out after " + seconds_text(options.timeout_s) + " s: rank" +
                (missing.size() > 1 ? "s " : " ") + rank_list(missing) + " of " +
                std::to_string(world_size_) + " never arrived; start " +
                (missing.size() > 1 ? "them" : "it") +
                " with the same MASTER_ADDR / MASTER_PORT, or raise --distributed-timeout-minutes";
      linger_end = deadline;
    }
    if (failure) {
      int told = 0;
      for (Arrival& a : arrivals) {
        if (a.socket && a.hello && !a.told)
          a.told = a.socket->send(FrameType::kError, *failure, deadline_after(kSendTimeoutS));
        told += a.told ? 1 : 0;
      }
      // Done when as many processes as rank 0 expects heard the verdict, or the linger ran out.
      if (told >= world_size_ - 1 || SteadyClock::now() >= linger_end) throw UserError(*failure);
    }
    std::vector<int> fds = {listener.fd()};
    for (const Arrival& a : arrivals)
      if (a.socket) fds.push_back(a.socket->fd());
    wait_readable(fds, milliseconds_until(failure ? linger_end : deadline, kPollSliceMs));
  }
  for (int r = 1; r < world_size_; ++r) {
    peers_[r] = std::move(arrivals[roll.arrival_of(r)].socket);
    if (!peers_[r]->send(FrameType::kWelcome, blob, deadline_after(kSendTimeoutS)))
      throw UserError(where + "rank " + std::to_string(r) + " vanished before it received the NCCL id");
  }
  blob_ = blob;
}

void TcpRendezvous::run_member(const RendezvousOptions& options) {
  const std::string where = "rendezvous at " + endpoint() + ": ";
  const std::string me = "rank " + std::to_string(rank_);
  std::string error = "no attempt";
  std::unique_ptr<FramedSocket> socket = connect_until(master_addr_, master_port_, options.connect_retry_s,
                                                       deadline_after(options.timeout_s), &error);
  if (!socket)
    throw UserError(where + me + " could not reach rank 0 within " + seconds_text(options.timeout_s) +
                    " s (" + error + "); start rank 0 with the same MASTER_ADDR / MASTER_PORT");
  // Rank 0 started no later than this connection, so its verdict comes before this deadline.
  const SteadyClock::time_point deadline = deadline_after(options.timeout_s + kVerdictGraceS);
  socket->send(FrameType::kHello, encode_hello({rank_, world_size_, options.fingerprint}), deadline);
  for (;;) {
    std::vector<Frame> frames;
    const FramedSocket::ReadStatus status = socket->read_available(frames);
    for (std::size_t i = 0; i < frames.size(); ++i) {
      if (frames[i].type == FrameType::kError) throw UserError(frames[i].payload);
      if (frames[i].type != FrameType::kWelcome) continue;
      blob_ = frames[i].payload;
      for (std::size_t j = i + 1; j < frames.size() && !failure_; ++j)  // news that came with it
        if (frames[j].type == FrameType::kAbort) failure_ = frames[j].payload;
      peers_[0] = std::move(socket);
      return;
    }
    if (status == FramedSocket::ReadStatus::kGarbage)
      throw UserError(where +
                      "the program answering there is not megatune's rank 0; set MASTER_PORT to this "
                      "job's port");
    if (status == FramedSocket::ReadStatus::kClosed)
      throw UserError(where +
                      "rank 0 closed the connection before the rendezvous completed (see rank 0's "
                      "output)");
    if (SteadyClock::now() >= deadline)
      throw UserError(where + "rank 0 accepted " + me + " but gave no answer within " +
                      seconds_text(options.timeout_s + kVerdictGraceS) + " s");
    wait_readable({socket->fd()}, milliseconds_until(deadline, kPollSliceMs));
  }
}

void TcpRendezvous::announce_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = message;
  for (auto& peer : peers_)
    if (peer) peer->send(FrameType::kAbort, message, deadline_after(kSendTimeoutS));
}

std::optional<std::string> TcpRendezvous::poll_failure(int timeout_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) failure_ = read_control_news(timeout_ms);
  return failure_;
}

std::optional<std::string> TcpRendezvous::read_control_news(int timeout_ms) {
  std::vector<int> fds;
  for (const auto& peer : peers_)
    if (peer) fds.push_back(peer->fd());
  if (fds.empty()) return std::nullopt;
  wait_readable(fds, timeout_ms);
  std::optional<std::string> news;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    if (!peers_[r]) continue;
    std::vector<Frame> frames;
    const FramedSocket::ReadStatus status = peers_[r]->read_available(frames);
    bool goodbye = false;
    for (const Frame& frame : frames) {
      if ((frame.type == FrameType::kAbort || frame.type == FrameType::kError) && !news) news = frame.payload;
      goodbye = goodbye || frame.type == FrameType::kGoodbye;
    }
    if (status != FramedSocket::ReadStatus::kOpen && !goodbye && !news)
      news = "rank " + std::to_string(r) +
             "'s control connection closed without a goodbye: its process ended " +
             "or its host became unreachable (see rank " + std::to_string(r) + "'s output)";
    if (goodbye || status != FramedSocket::ReadStatus::kOpen) peers_[r].reset();
  }
  if (news && rank_ == 0)  // relay to every rank
    for (auto& peer : peers_)
      if (peer) peer->send(FrameType::kAbort, *news, deadline_after(kSendTimeoutS));
  return news;
}

void TcpRendezvous::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& peer : peers_) {
    if (peer && !failure_) peer->send(FrameType::kGoodbye, "", deadline_after(kSendTimeoutS));
    peer.reset();
  }
}

// Ports are drawn at random below Linux's default ephemeral range (32768-60999), where the kernel hands out
// neither bind(0) nor outgoing ports: asking the kernel for a free port and closing it returns the same port
// to two processes that ask at once (two launches on one host, tests run in parallel), a random draw almost
// never.
int free_local_port() {
  constexpr int kFirst = 20000, kLast = 32767, kTries = 200;
  std::random_device entropy;
  std::mt19937 draw((static_cast<std::uint64_t>(entropy()) << 32) ^ static_cast<std::uint64_t>(getpid()));
  std::uniform_int_distribution<int> port_in(kFirst, kLast);
  std::string error = "every port tried was in use";
  for (int attempt = 0; attempt < kTries; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int port = port_in(draw);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    if (!bound) error = std::strerror(errno);
    ::close(fd);
    if (bound) return port;
  }
  throw std::runtime_error("no free local TCP port in " + std::to_string(kFirst) + "-" +
                           std::to_string(kLast) + ": " + error);
}

}  // namespace megatune::executor
