// NcclCommunicator: the Communicator of one GPU rank over NCCL: one communicator per process group this rank
// is in (split from the world communicator), each group's collectives on its own stream of the backend
// (Communicator::stream_group: one stream per communicator), and a watchdog that turns NCCL's asynchronous
// errors, a peer's failure and a hung collective into an abort of every rank with one line.
#pragma once
#include <nccl.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/launch_environment.h"
#include "executor/parallel/tcp_rendezvous.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {

// The communicator plumbing the executor and the profiler share. NCCL_NVLS_ENABLE=0 is put in the
// environment (when unset) once, by the first of new_nccl_unique_id / init_world_communicator: with
// ranks as threads of one process, call new_nccl_unique_id before starting them (setenv is not
// thread-safe).
namespace cuda {
std::string new_nccl_unique_id();  // ncclGetUniqueId as its 128 bytes
ncclComm_t init_world_communicator(int world_size, int rank, const std::string& unique_id);
// Collective over every rank of `world`: the communicator of `members` (global ranks in group order; NCCL
// ranks follow that order) for a rank among them, null for a rank outside (and for a group of one unless
// `single_member_too`).
ncclComm_t split_communicator(ncclComm_t world, int world_rank, const std::vector<int>& members,
                              bool single_member_too = false);
}  // namespace cuda

struct NcclOptions {
  // A collective that has not completed this long after it was issued aborts the job (a peer stopped
  // participating). The watchdog checks every `watchdog_interval_s`.
  double collective_timeout_s = 600.0;
  double watchdog_interval_s = 0.05;
  // Communicator setup is blocking: past this, or when a peer fails meanwhile, the rank writes the reason
  // to stderr and ends its process (exit status 1) instead of hanging.
  double setup_timeout_s = 300.0;
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over every rank of `grid` (same grid and unique id everywhere); the backend's GPU is this
  // rank's. `control` (optional, outliving this) carries failures between the ranks. A world of one makes
  // no NCCL communicator at all. See NcclOptions::setup_timeout_s for a setup that cannot complete.
  NcclCommunicator(CudaBackend& backend, const layouts::RankGrid& grid, int world_rank,
                   const std::string& unique_id, TcpRendezvous* control = nullptr, NcclOptions options = {});
  // The usual way in: checks the launcher's world size against the grid's, meets the other ranks at
  // MASTER_ADDR:MASTER_PORT (rank 0's unique id travels over it) and keeps the rendezvous as the control
  // channel. Throws a UserError for a mismatched layout or a failed rendezvous.
  static std::unique_ptr<NcclCommunicator> connect(CudaBackend& backend, const layouts::RankGrid& grid,
                                                   const LaunchEnvironment& launch,
                                                   const RendezvousOptions& rendezvous,
                                                   NcclOptions options = {});
  ~NcclCommunicator() override;

  int world_rank() const override { return world_rank_; }
  int world_size() const override { return world_size_; }
  int rank(CommGroup group) const override;
  int size(CommGroup group) const override;
  int global_rank(CommGroup group, int rank_in_group) const override;
  // The NCCL communicator of `group`; null when the group has one member.
  ncclComm_t nccl_comm(CommGroup group) const { return groups_[index(group)].comm; }

  // Aborts every NCCL communicator of this rank (pending collectives end), tells the other ranks through
  // the control channel and makes every later call throw std::runtime_error(message). Does not throw.
  void abort(const std::string& message) override;
  // Host wait for everything issued so far on every stream; throws std::runtime_error with the job's
  // failure (an NCCL error, a peer's message, a timeout) instead of hanging.
  void synchronize();
  // The failure that ended the job, if any.
  std::optional<std::string> failure() const;

 protected:
  CommHandle do_all_reduce(CommGroup group, Tensor tensor, ReduceOp op) override;
  CommHandle do_all_gather(CommGroup group, Tensor input, Tensor output) override;
  CommHandle do_reduce_scatter(CommGroup group, Tensor input, Tensor output) override;
  CommHandle do_broadcast(CommGroup group, Tensor tensor, int root_in_group) override;
  CommHandle do_all_to_all(CommGroup group, Tensor input, const std::vector<std::int64_t>& send_rows,
                           Tensor output, const std::vector<std::int64_t>& receive_rows) override;
  CommHandle do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) override;

 private:
  struct Group {
    std::vector<int> members;  // global ranks in group order
    int rank = 0;              // this rank's index in members
    ncclComm_t comm = nullptr;
    bool owned = false;  // false: shared with an earlier group of the same members (or the world's)
  };
  class Work;
  struct EventPool;
  struct Pending;  // an issued collective the watchdog follows

  static std::size_t index(CommGroup group) { return static_cast<std::size_t>(group); }
  void create_communicators(const layouts::RankGrid& grid, const std::string& unique_id);
  ncclComm_t begin(CommGroup group, const char* what);  // throws after a failure; orders after compute
  CommHandle finish(CommGroup group, const char* what);
  cudaStream_t stream(CommGroup group);  // the backend's stream of the group's communicator
  template <typename Calls>
  CommHandle issue(CommGroup group, const char* what, Calls&& calls);
  void throw_if_failed() const;
  void fail(const std::string& message, bool tell_peers);
  void watch();
  // A problem the watchdog sees: (message, whether this rank must tell the others).
  std::optional<std::pair<std::string, bool>> check_health();

  CudaBackend& cuda_;
  int world_rank_, world_size_, device_ = 0;
  NcclOptions options_;
  std::unique_ptr<TcpRendezvous> owned_control_;
  TcpRendezvous* control_;
  ncclComm_t world_ = nullptr;
  std::vector<Group> groups_;  // by CommGroup
  std::shared_ptr<EventPool> events_;
  std::deque<std::shared_ptr<Pending>> pending_;  // watchdog's, under mutex_
  mutable std::mutex mutex_;
  std::optional<std::string> failure_;  // under mutex_
  std::atomic<bool> aborted_{false};
  // Held while NCCL calls are issued, so an abort from the watchdog does not free a communicator under
  // them (it waits a little, then aborts anyway: a call blocked on a dead peer must be released).
  std::recursive_timed_mutex issue_mutex_;
  std::mutex health_mutex_;  // held by the watchdog's checks, so an abort does not free a comm under them
  bool stop_ = false;        // under mutex_
  std::condition_variable wake_;
  std::thread watchdog_;
};

}  // namespace megatune::executor
