// ThreadCommunicator: the Communicator of one rank of a ThreadWorld (ranks as threads of one process, each
// with its own backend). Data really moves between the ranks' buffers: read in place from a CpuBackend's
// float storage, or staged through the host (download, reduce in float, upload) from any other backend, so
// that several CUDA ranks share one GPU with the CPU ranks' semantics (the CUDA twin of the CPU threads:
// for correctness, not speed; NCCL stays the production path).
#pragma once
#include <array>

#include "executor/cpu/cpu_backend.h"
#include "executor/cpu/thread_world.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/process_groups.h"

namespace megatune::executor {

// Semantics on top of Communicator's:
// - Reductions are deterministic and independent of thread timing: element i of a sum is
//   ((member 0 + member 1) + member 2) + ... in float, in group-rank order (max likewise; a NaN wins), so a
//   run is bit-reproducible. A bf16-typed result is then rounded to bf16 by the receiving rank's backend
//   (its upload: CpuBackend rounds like every kernel output when it emulates bf16; the CUDA backend stores
//   bf16). A staged backend's transfers run on the group's communication stream (Communicator's
//   stream_group), after the compute work issued before the collective; the compute stream waits for them
//   before the collective returns.
// - The async forms complete eagerly: the data is in place when *_async returns, and the handle is nullptr
//   (as for size-1 groups: callers test the handle before waiting).
// - all_to_all moves each member's block through the mailboxes below (a send and a receive per pair, as
//   NCCL's grouped send/recv), so the blocks may differ in size.
// - Batched send/recv: sends are copied into per-(group, source, destination) FIFO mailboxes and never
//   block, so no batch of sends and receives can deadlock; each receive blocks until the matching message
//   arrives (sizes must match; messages between a pair are matched in issue order).
// - Every blocking wait ends within the world's timeout; an abort, a mismatched collective, a size
//   mismatch or a timeout ends every rank with one std::runtime_error naming the group and the ranks.
class ThreadCommunicator final : public Communicator {
 public:
  // `groups` must describe a rank of a grid of world.size() ranks.
  ThreadCommunicator(Backend& backend, ThreadWorld& world, ProcessGroups groups);

  int world_rank() const override { return groups_.world_rank(); }
  int world_size() const override { return groups_.world_size(); }
  int rank(CommGroup group) const override { return groups_.rank_in(group); }
  int size(CommGroup group) const override { return groups_.size(group); }
  int global_rank(CommGroup group, int rank_in_group) const override {
    return groups_.global_rank(group, rank_in_group);
  }
  const ProcessGroups& groups() const { return groups_; }
  void abort(const std::string& message) override { world_.abort(message); }

 protected:
  CommHandle do_all_reduce(CommGroup group, Tensor tensor, ReduceOp op) override;
  CommHandle do_all_gather(CommGroup group, Tensor input, Tensor output) override;
  CommHandle do_reduce_scatter(CommGroup group, Tensor input, Tensor output) override;
  CommHandle do_broadcast(CommGroup group, Tensor tensor, int root_in_group) override;
  CommHandle do_all_to_all(CommGroup group, Tensor input, const std::vector<std::int64_t>& send_rows,
                           Tensor output, const std::vector<std::int64_t>& receive_rows) override;
  CommHandle do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) override;

 private:
  using Contributions = std::vector<ThreadWorld::Contribution>;
  // One collective: publishes `input`, waits for every member, lets fill(contributions, result) compute
  // this member's output from all inputs, waits until every member is done reading, then writes `output`.
  template <typename Fill>
  void collective(CommGroup group, const char* op, Tensor input, int root, Tensor output, Fill&& fill);
  ThreadWorld::Group& state(CommGroup group);
  // `t`'s values as floats: its storage on the CPU backend, else a host copy kept in `staged` (downloaded
  // on the collective's stream).
  const float* host_floats(const Tensor& t, Backend::Stream stream, std::vector<float>& staged);
  // An owned host copy of t's values (what a posted p2p message holds).
  std::vector<float> host_copy(const Tensor& t, Backend::Stream stream);
  void end_transfer_op(std::size_t from_last);  // the CPU backend's op timing (see CpuBackend)

  CpuBackend* cpu_;  // the backend when it is the CPU's (read in place), else null (staged)
  ThreadWorld& world_;
  ProcessGroups groups_;
  std::array<ThreadWorld::Group*, ProcessGroups::kGroupCount> states_{};
};

}  // namespace megatune::executor
