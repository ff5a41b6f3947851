// ThreadCommunicator: collectives and batched p2p between ranks that are threads, reading the other
// members' float buffers (in place, or host copies of device tensors) between two rendezvous of the
// ThreadWorld.
#include "executor/cpu/thread_communicator.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace megatune::executor {

namespace {

const float* floats(const Tensor& t) { return static_cast<const float*>(t.data); }

std::string group_label(CommGroup group) { return std::string("group ") + layouts::comm_group_name(group); }

}  // namespace

ThreadCommunicator::ThreadCommunicator(Backend& backend, ThreadWorld& world, ProcessGroups groups)
    : Communicator(backend),
      cpu_(dynamic_cast<CpuBackend*>(&backend)),
      world_(world),
      groups_(std::move(groups)) {
  if (groups_.world_size() != world_.size())
    throw std::invalid_argument("ThreadCommunicator: the rank grid has " +
                                std::to_string(groups_.world_size()) + " ranks but the thread world " +
                                std::to_string(world_.size()));
  for (int g = 0; g < ProcessGroups::kGroupCount; ++g) {
    const auto kind = static_cast<CommGroup>(g);
    if (groups_.size(kind) > 1) states_[g] = &world_.group(kind, groups_.members(kind));
  }
}

ThreadWorld::Group& ThreadCommunicator::state(CommGroup group) {
  ThreadWorld::Group* g = states_.at(static_cast<int>(group));
  if (g == nullptr) throw std::logic_error("ThreadCommunicator: " + group_label(group) + " has one member");
  return *g;
}

const float* ThreadCommunicator::host_floats(const Tensor& t, Backend::Stream stream,
                                             std::vector<float>& staged) {
  if (cpu_ != nullptr) return floats(t);
  staged.resize(static_cast<std::size_t>(t.numel()));
  backend_.download(t, staged.data(), stream);
  return staged.data();
}

std::vector<float> ThreadCommunicator::host_copy(const Tensor& t, Backend::Stream stream) {
  if (cpu_ != nullptr) return std::vector<float>(floats(t), floats(t) + t.numel());
  std::vector<float> copy(static_cast<std::size_t>(t.numel()));
  backend_.download(t, copy.data(), stream);
  return copy;
}

void ThreadCommunicator::end_transfer_op(std::size_t from_last) {
  if (cpu_ != nullptr) cpu_->end_timed_op_now(from_last);
}

template <typename Fill>
void ThreadCommunicator::collective(CommGroup group, const char* op, Tensor input, int root, Tensor output,
                                    Fill&& fill) {
  if (input.is_int32 || output.is_int32)
    world_.fail(std::string(op) + " over " + group_label(group) + ": int32 tensors are not supported");
  ThreadWorld::Group& g = state(group);
  const int me = groups_.rank_in(group);
  const Backend::Stream stream = begin_on_stream(group);
  std::vector<float> staged;
  ThreadWorld::Contribution mine{op, input.numel(), root, host_floats(input, stream, staged)};
  std::vector<float> result(static_cast<std::size_t>(output.numel()));
  const Contributions& all = world_.arrive(g, me, std::move(mine));
  fill(all, me, result.data());
  world_.depart(g, me);  // nobody reads our input any more: safe to overwrite it (in-place collectives)
  backend_.upload(output, result.data(), stream);
  compute_waits_for(group);
  end_transfer_op(0);  // the collective's op (recorded just before) covers the exchange
}

CommHandle ThreadCommunicator::do_all_reduce(CommGroup group, Tensor tensor, ReduceOp op) {
  const bool sum = op == ReduceOp::kSum;
  collective(group, sum ? "all_reduce sum" : "all_reduce max", tensor, -1, tensor,
             [&](const Contributions& all, int, float* out) {
               const std::int64_t n = tensor.numel();
               for (std::int64_t i = 0; i < n; ++i) out[i] = all[0].input[i];
               for (std::size_t j = 1; j < all.size(); ++j) {
                 const float* in = all[j].input;
                 if (sum) {
                   for (std::int64_t i = 0; i < n; ++i) out[i] += in[i];
                 } else {
                   for (std::int64_t i = 0; i < n; ++i)
                     if (in[i] > out[i] || std::isnan(in[i])) out[i] = std::isnan(out[i]) ? out[i] : in[i];
                 }
               }
             });
  return nullptr;
}

CommHandle ThreadCommunicator::do_all_gather(CommGroup group, Tensor input, Tensor output) {
  collective(group, "all_gather", input, -1, output, [&](const Contributions& all, int, float* out) {
    const std::int64_t n = input.numel();
    for (std::size_t j = 0; j < all.size(); ++j)
      for (std::int64_t i = 0; i < n; ++i) out[j * n + i] = all[j].input[i];
  });
  return nullptr;
}

CommHandle ThreadCommunicator::do_reduce_scatter(CommGroup group, Tensor input, Tensor output) {
  collective(group, "reduce_scatter", input, -1, output, [&](const Contributions& all, int me, float* out) {
    const std::int64_t n = output.numel();
    const std::int64_t begin = me * n;
    for (std::int64_t i = 0; i < n; ++i) out[i] = all[0].input[begin + i];
    for (std::size_t j = 1; j < all.size(); ++j)
      for (std::int64_t i = 0; i < n; ++i) out[i] += all[j].input[begin + i];
  });
  return nullptr;
}

CommHandle ThreadCommunicator::do_broadcast(CommGroup group, Tensor tensor, int root_in_group) {
  if (root_in_group < 0 || root_in_group >= size(group))
    world_.fail("broadcast over " + group_label(group) + ": root " + std::to_string(root_in_group) +
                " is not a member (size " + std::to_string(size(group)) + ")");
  collective(group, "broadcast", tensor, root_in_group, tensor,
             [&](const Contributions& all, int, float* out) {
               const float* in = all[root_in_group].input;
               for (std::int64_t i = 0; i < tensor.numel(); ++i) out[i] = in[i];
             });
  return nullptr;
}

CommHandle ThreadCommunicator::do_all_to_all(CommGroup group, Tensor input,
                                             const std::vector<std::int64_t>& send_rows, Tensor output,
                                             const std::vector<std::int64_t>& receive_rows) {
  if (input.is_int32 || output.is_int32) world_.fail("all_to_all: int32 tensors are not supported");
  const int n = size(group), me = rank(group), me_world = world_rank();
  const std::int64_t cols = input.cols;
  std::vector<std::int64_t> send_first(static_cast<std::size_t>(n) + 1, 0), receive_first = send_first;
  for (int j = 0; j < n; ++j) {
    send_first[j + 1] = send_first[j] + send_rows[j];
    receive_first[j + 1] = receive_first[j] + receive_rows[j];
  }
  const Backend::Stream stream = begin_on_stream(group);
  std::vector<float> staged;
  const float* data = host_floats(input, stream, staged);
  for (int j = 0; j < n; ++j)  // buffered sends never block
    if (j != me)
      world_.post(group, me_world, global_rank(group, j),
                  std::vector<float>(data + send_first[j] * cols, data + send_first[j + 1] * cols));
  std::vector<float> result(static_cast<std::size_t>(receive_first[n] * cols));
  for (int i = 0; i < n; ++i) {
    float* out = result.data() + receive_first[i] * cols;
    if (i == me) {
      if (send_rows[me] != receive_rows[me])
        world_.fail("all_to_all over " + group_label(group) + ": rank " + std::to_string(me_world) +
                    " sends itself " + std::to_string(send_rows[me]) + " rows but expects " +
                    std::to_string(receive_rows[me]));
      std::copy(data + send_first[me] * cols, data + send_first[me + 1] * cols, out);
      continue;
    }
    const int source = global_rank(group, i);
    const std::vector<float> block = world_.take(group, source, me_world);
    if (static_cast<std::int64_t>(block.size()) != receive_rows[i] * cols)
      world_.fail("rank " + std::to_string(me_world) + ": all_to_all over " + group_label(group) +
                  " received " + std::to_string(block.size()) + " elements from rank " +
                  std::to_string(source) + " for " + std::to_string(receive_rows[i] * cols));
    std::copy(block.begin(), block.end(), out);
  }
  if (!result.empty()) backend_.upload(output, result.data(), stream);
  compute_waits_for(group);
  end_transfer_op(0);  // the all-to-all's op (recorded just before) covers the exchange
  return nullptr;
}

CommHandle ThreadCommunicator::do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) {
  const int me = world_rank();
  for (const P2pTransferArgs& t : transfers) {
    if (groups_.index_of(group, t.peer_rank) < 0)
      world_.fail("rank " + std::to_string(me) + ": batch_p2p peer " + std::to_string(t.peer_rank) +
                  " is not in its " + group_label(group));
    if (t.tensor.is_int32) world_.fail("batch_p2p: int32 tensors are not supported");
  }
  const Backend::Stream stream = begin_on_stream(group);
  for (const P2pTransferArgs& t : transfers)  // all sends first: buffered, they never block
    if (t.send) world_.post(group, me, t.peer_rank, host_copy(t.tensor, stream));
  // The transfers were recorded as ops just before, sends then receives: each receive's op ends when its
  // data is in place.
  std::size_t receives_left = static_cast<std::size_t>(
      std::count_if(transfers.begin(), transfers.end(), [](const P2pTransferArgs& t) { return !t.send; }));
  for (const P2pTransferArgs& t : transfers) {
    if (t.send) continue;
    const std::vector<float> data = world_.take(group, t.peer_rank, me);
    if (static_cast<std::int64_t>(data.size()) != t.tensor.numel())
      world_.fail("rank " + std::to_string(me) + ": batch_p2p over " + group_label(group) + " received " +
                  std::to_string(data.size()) + " elements from rank " + std::to_string(t.peer_rank) +
                  " into a tensor of " + std::to_string(t.tensor.numel()));
    backend_.upload(t.tensor, data.data(), stream);
    end_transfer_op(--receives_left);
  }
  compute_waits_for(group);
  return nullptr;
}

}  // namespace megatune::executor
