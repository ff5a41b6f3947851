// Communicator: the collectives and point-to-point transfers a rank issues over its process groups, with
// asynchronous work handles and op recording (the collectives a rank issues are recorded like its kernels).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/backend/op_recorder.h"
#include "executor/backend/tensor.h"
#include "layouts/op.h"

namespace megatune::executor {

using layouts::CommGroup;

enum class ReduceOp { kSum, kMax };

// A collective in flight. wait() orders the compute stream after it (an event wait on the GPU; on the CPU
// backend it returns once the data is in place). Waiting twice is a no-op; a handle destroyed unwaited waits.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
};
using CommHandle = std::unique_ptr<CommWork>;

// One transfer of a batched point-to-point exchange (Megatron's batch_isend_irecv).
struct P2pTransferArgs {
  bool send = true;
  Tensor tensor;                    // contiguous; a receive writes it
  int peer_rank = -1;               // global rank on the other side (layouts::Op::peer_rank)
  OpTag tag;                        // label ("p2p_activation" / "p2p_gradient"), phase
  int microbatch = -1, chunk = -1;  // stamped on the recorded op (the transfer's, not the schedule position)
};

// Every call names the group it runs over. Tensors are contiguous. Calls on a group of size 1 issue and
// record nothing (all_gather / reduce_scatter copy when input and output differ). Each issued call is
// recorded as one layouts::Op on the backend's recorder, bytes after nccl-tests' conventions (layouts/op.h),
// stamped with the tag, the recorder's schedule position and the stream. Each group's collectives run on
// its communication stream (stream_group), after the compute work issued so far; the blocking forms make
// the compute stream wait for them at once, an async form's handle when it is waited. Two groups' streams
// are not ordered against each other: data one group's collective hands to another's goes through the
// compute stream (its handle waited first). All members of a group must issue the same collectives on it
// in the same order.
class Communicator {
 public:
  explicit Communicator(Backend& backend) : backend_(backend) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  virtual int rank(CommGroup group) const = 0;  // this rank's index in its group of `group`
  virtual int size(CommGroup group) const = 0;
  // Global rank of member `rank_in_group` of this rank's group of `group`.
  virtual int global_rank(CommGroup group, int rank_in_group) const = 0;
  Backend& backend() const { return backend_; }
  // The group whose communication stream this rank issues `group`'s work on: layouts::stream_groups over
  // this rank's members of each group (a stream per communicator). kNone for kNone.
  CommGroup stream_group(CommGroup group) const;

  // In place: every member ends with the reduction of all members' `tensor`.
  void all_reduce(CommGroup group, Tensor tensor, ReduceOp op, const OpTag& tag);
  CommHandle all_reduce_async(CommGroup group, Tensor tensor, ReduceOp op, const OpTag& tag);
  // `output` (size * input.rows, cols) gathers every member's `input` along rows, in group-rank order.
  void all_gather(CommGroup group, Tensor input, Tensor output, const OpTag& tag);
  CommHandle all_gather_async(CommGroup group, Tensor input, Tensor output, const OpTag& tag);
  // `output` (input.rows / size, cols) receives this member's row slice of the sum over members.
  void reduce_scatter(CommGroup group, Tensor input, Tensor output, const OpTag& tag);
  CommHandle reduce_scatter_async(CommGroup group, Tensor input, Tensor output, const OpTag& tag);
  // Every member's `tensor` becomes the root's.
  void broadcast(CommGroup group, Tensor tensor, int root_in_group, const OpTag& tag);
  // `input` and `output` (same shape) hold size equal row blocks; block j of the input goes to member j,
  // block i of the output comes from member i.
  void all_to_all(CommGroup group, Tensor input, Tensor output, const OpTag& tag);
  // Variable splits (Megatron's all-to-all with input and output split sizes): the first sum(send_rows)
  // rows of `input` are size consecutive blocks, block j (send_rows[j] rows) going to member j; the first
  // sum(receive_rows) rows of `output` receive member i's block for this member (receive_rows[i] rows) in
  // member order. Only those rows move, and the recorded bytes are the rows sent.
  void all_to_all(CommGroup group, Tensor input, const std::vector<std::int64_t>& send_rows, Tensor output,
                  const std::vector<std::int64_t>& receive_rows, const OpTag& tag);
  // Posts every transfer together and returns when all of them met their peers' matching transfers (each
  // transfer is recorded as one kSend / kRecv op with its peer).
  void batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers);
  // The same, returning at once: the handle's wait() completes it (context parallelism's ring overlaps its
  // transfers with attention). The tensors stay untouched until then.
  CommHandle batch_p2p_async(CommGroup group, const std::vector<P2pTransferArgs>& transfers);

  // Ends the job: every rank's pending and later calls throw std::runtime_error carrying `message` (the
  // failing rank's reason). Safe to call from any thread, more than once.
  virtual void abort(const std::string& message) = 0;

 protected:
  // Implementations (group size > 1, shapes checked). The async forms return a handle; the base class
  // waits on it for the blocking forms.
  virtual CommHandle do_all_reduce(CommGroup group, Tensor tensor, ReduceOp op) = 0;
  virtual CommHandle do_all_gather(CommGroup group, Tensor input, Tensor output) = 0;
  virtual CommHandle do_reduce_scatter(CommGroup group, Tensor input, Tensor output) = 0;
  virtual CommHandle do_broadcast(CommGroup group, Tensor tensor, int root_in_group) = 0;
  // input (sum(send_rows), cols), output (sum(receive_rows), cols); one count per member.
  virtual CommHandle do_all_to_all(CommGroup group, Tensor input, const std::vector<std::int64_t>& send_rows,
                                   Tensor output, const std::vector<std::int64_t>& receive_rows) = 0;
  virtual CommHandle do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) = 0;

  // The stream of `group`, ordered after the compute work issued so far: where an implementation issues
  // the group's collective.
  Backend::Stream begin_on_stream(CommGroup group);
  // Orders the compute stream after the work issued on `group`'s stream so far.
  void compute_waits_for(CommGroup group);

  Backend& backend_;

 private:
  mutable std::optional<std::array<CommGroup, layouts::kCommGroupCount>> streams_;  // on first use
  void record(layouts::OpKind kind, CommGroup group, std::int64_t bytes, DType dtype, const OpTag& tag,
              int peer_rank = -1, int microbatch = -2, int chunk = -2);
};

// One process, one rank: every group has size 1 (world rank 0). Collectives are identities or copies;
// point-to-point transfers have no peer and are an error.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(Backend& backend) : Communicator(backend) {}
  int world_rank() const override { return 0; }
  int world_size() const override { return 1; }
  int rank(CommGroup) const override { return 0; }
  int size(CommGroup) const override { return 1; }
  int global_rank(CommGroup, int) const override { return 0; }
  void abort(const std::string& message) override;

 protected:
  CommHandle do_all_reduce(CommGroup, Tensor, ReduceOp) override { return nullptr; }
  CommHandle do_all_gather(CommGroup, Tensor, Tensor) override { return nullptr; }
  CommHandle do_reduce_scatter(CommGroup, Tensor, Tensor) override { return nullptr; }
  CommHandle do_broadcast(CommGroup, Tensor, int) override { return nullptr; }
  CommHandle do_all_to_all(CommGroup, Tensor, const std::vector<std::int64_t>&, Tensor,
                           const std::vector<std::int64_t>&) override {
    return nullptr;
  }
  CommHandle do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) override;
};

// Bytes of a tensor in its logical dtype (what the step program counts).
std::int64_t logical_bytes(const Tensor& t);

}  // namespace megatune::executor
