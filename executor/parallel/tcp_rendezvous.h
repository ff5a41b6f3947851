// TcpRendezvous: the ranks of a multi-process job meet at MASTER_ADDR:MASTER_PORT, rank 0 checks that they
// agree (world size, distinct ranks, one configuration) and hands every rank a blob (the NCCL unique id);
// the connections stay open afterwards as a control channel that spreads a rank's failure to every rank.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "executor/parallel/launch_environment.h"

namespace megatune::executor {

class FramedSocket;

struct RendezvousOptions {
  // The whole rendezvous is bounded by it: a rank that never arrives ends every rank that did with a line
  // naming the missing ranks. (A rank started before rank 0 also waits for rank 0 to start: at most this
  // long after rank 0 started, plus a few seconds for rank 0's verdict to arrive.)
  double timeout_s = 120.0;  // `megatune train`: --distributed-timeout-minutes
  // Identity of the job's configuration (model, layout, flags): must be equal on every rank.
  std::string fingerprint;
  double connect_retry_s = 0.05;  // pause between connection attempts while rank 0 is not listening yet
  // After a failed check, how long rank 0 keeps telling ranks that arrive late why the job failed.
  double error_linger_s = 3.0;
};

// One rank's end of the rendezvous and of the control channel. All methods are thread-safe.
class TcpRendezvous {
 public:
  // Collective over the ranks of `launch`. Returns once every rank arrived and rank 0's `blob` (ignored on
  // the other ranks) reached it; otherwise throws a UserError with one line every rank shares where it can
  // (missing ranks, a wrong world size, a duplicate rank, a different configuration). Never blocks past
  // the timeout. A single-process job opens no socket.
  TcpRendezvous(const LaunchEnvironment& launch, const RendezvousOptions& options,
                const std::string& blob_on_rank0);
  ~TcpRendezvous();  // close()
  TcpRendezvous(const TcpRendezvous&) = delete;
  TcpRendezvous& operator=(const TcpRendezvous&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& blob() const { return blob_; }
  std::string endpoint() const;  // "MASTER_ADDR:MASTER_PORT"

  // Tells every other rank that the job failed (`message`, e.g. "rank 3 failed: ..."): rank 0 sends it to
  // all, another rank to rank 0, which relays it on its next poll_failure().
  void announce_failure(const std::string& message);
  // The failure a peer announced, or the loss of a peer's connection ("rank 2's control connection
  // closed ..."); nullopt while all is well. Waits at most `timeout_ms` for news. Once a failure was seen
  // it is returned on every later call.
  std::optional<std::string> poll_failure(int timeout_ms = 0);
  // Says goodbye to the peers (a closed connection after goodbye is no failure) and closes the sockets.
  void close();

 private:
  void run_rank0(const RendezvousOptions& options, const std::string& blob);
  void run_member(const RendezvousOptions& options);
  std::optional<std::string> read_control_news(int timeout_ms);

  int rank_ = 0, world_size_ = 1;
  std::string master_addr_;
  int master_port_ = 0;
  std::string blob_;
  // Rank 0: peers_[r] is rank r's connection (peers_[0] empty); other ranks: peers_[0] is rank 0's.
  std::vector<std::unique_ptr<FramedSocket>> peers_;
  std::optional<std::string> failure_;
  std::mutex mutex_;
};

// A TCP port on 127.0.0.1 that nobody listens on right now (for a one-host launch).
int free_local_port();

}  // namespace megatune::executor
