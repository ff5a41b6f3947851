// Communicator: the collectives the model and the training loop issue, over a named process group.
#pragma once
#include <memory>

#include "executor/backend/tensor.h"
#include "layouts/op.h"

namespace megatune::executor {

using layouts::CommGroup;

enum class ReduceOp { kSum, kMax };

// Collectives operate in place on backend memory and are enqueued on the backend's communication stream.
// Megatron's call sites (tensor-parallel regions, gradient reduction, pipeline p2p) call these with the
// group they run over; a group of size 1 is a no-op that issues nothing.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank(CommGroup group) const = 0;
  virtual int size(CommGroup group) const = 0;
  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual void all_reduce(CommGroup group, Tensor tensor, ReduceOp op) = 0;
  // `output` (size(group) * input.rows, cols) gathers every rank's `input` along rows.
  virtual void all_gather(CommGroup group, Tensor input, Tensor output) = 0;
  // `output` (input.rows / size(group), cols) receives this rank's row-slice of the sum.
  virtual void reduce_scatter(CommGroup group, Tensor input, Tensor output) = 0;
  virtual void send(CommGroup group, Tensor tensor, int peer_rank_in_group) = 0;
  virtual void recv(CommGroup group, Tensor tensor, int peer_rank_in_group) = 0;
};

// One process, one rank: every group has size 1. Collectives of size 1 are identities; all_gather and
// reduce_scatter copy; send/recv have no peer and are an error.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(class Backend& backend) : backend_(backend) {}
  int rank(CommGroup) const override { return 0; }
  int size(CommGroup) const override { return 1; }
  void all_reduce(CommGroup, Tensor, ReduceOp) override {}
  void all_gather(CommGroup group, Tensor input, Tensor output) override;
  void reduce_scatter(CommGroup group, Tensor input, Tensor output) override;
  void send(CommGroup group, Tensor tensor, int peer_rank_in_group) override;
  void recv(CommGroup group, Tensor tensor, int peer_rank_in_group) override;

 private:
  class Backend& backend_;
};

}  // namespace megatune::executor
