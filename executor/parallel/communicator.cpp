// Communicator: shape checks, size-1 shortcuts and op recording around the implementations' collectives;
// SingleRankCommunicator, the one-process implementation.
#include "executor/parallel/communicator.h"

#include <stdexcept>
#include <string>

#include "layouts/rank_grid.h"

namespace megatune::executor {

using layouts::Op;
using layouts::OpKind;

std::int64_t logical_bytes(const Tensor& t) {
  return t.numel() * (t.is_int32 ? 4 : layouts::dtype_bytes(t.dtype));
}

namespace {

void require_contiguous(const Tensor& t, const char* what) {
  if (!t.contiguous()) throw std::logic_error(std::string(what) + ": tensor is not contiguous");
}

void wait_on(CommHandle handle) {
  if (handle) handle->wait();
}

}  // namespace

CommGroup Communicator::stream_group(CommGroup group) const {
  if (!streams_)
    streams_ = layouts::stream_groups([&](CommGroup g) {
      std::vector<int> members;
      for (int i = 0; i < size(g); ++i) members.push_back(global_rank(g, i));
      return members;
    });
  return (*streams_)[static_cast<int>(group)];
}

Backend::Stream Communicator::begin_on_stream(CommGroup group) {
  const Backend::Stream stream = Backend::Stream::communication(stream_group(group));
  backend_.wait_event(stream, backend_.record_event(Backend::Stream::compute()));
  return stream;
}

void Communicator::compute_waits_for(CommGroup group) {
  const Backend::Stream stream = Backend::Stream::communication(stream_group(group));
  backend_.wait_event(Backend::Stream::compute(), backend_.record_event(stream));
}

void Communicator::record(OpKind kind, CommGroup group, std::int64_t bytes, DType dtype, const OpTag& tag,
                          int peer_rank, int microbatch, int chunk) {
  Op op;
  op.kind = kind;
  op.dtype = dtype;
  op.bytes = bytes;
  op.group = group;
  op.group_size = size(group);
  op.peer_rank = peer_rank;
  op.stream = stream_group(group);
  backend_.begin_external_op(std::move(op), tag, microbatch, chunk);
  backend_.end_external_op();
}

CommHandle Communicator::all_reduce_async(CommGroup group, Tensor tensor, ReduceOp op, const OpTag& tag) {
  if (size(group) <= 1) return nullptr;
  require_contiguous(tensor, "all_reduce");
  record(OpKind::kAllReduce, group, logical_bytes(tensor), tensor.dtype, tag);
  return do_all_reduce(group, tensor, op);
}

void Communicator::all_reduce(CommGroup group, Tensor tensor, ReduceOp op, const OpTag& tag) {
  wait_on(all_reduce_async(group, tensor, op, tag));
}

CommHandle Communicator::all_gather_async(CommGroup group, Tensor input, Tensor output, const OpTag& tag) {
  const int n = size(group);
  if (output.rows != input.rows * n || output.cols != input.cols)
    throw std::logic_error("all_gather: output must be (size * input rows, input cols)");
  if (n <= 1) {
    if (input.data != output.data) backend_.copy(input, output);
    return nullptr;
  }
  require_contiguous(input, "all_gather");
  require_contiguous(output, "all_gather");
  record(OpKind::kAllGather, group, logical_bytes(output), output.dtype, tag);
  return do_all_gather(group, input, output);
}

void Communicator::all_gather(CommGroup group, Tensor input, Tensor output, const OpTag& tag) {
  wait_on(all_gather_async(group, input, output, tag));
}

CommHandle Communicator::reduce_scatter_async(CommGroup group, Tensor input, Tensor output,
                                              const OpTag& tag) {
  const int n = size(group);
  if (input.rows != output.rows * n || output.cols != input.cols)
    throw std::logic_error("reduce_scatter: input must be (size * output rows, output cols)");
  if (n <= 1) {
    if (input.data != output.data) backend_.copy(input, output);
    return nullptr;
  }
  require_contiguous(input, "reduce_scatter");
  require_contiguous(output, "reduce_scatter");
  record(OpKind::kReduceScatter, group, logical_bytes(input), input.dtype, tag);
  return do_reduce_scatter(group, input, output);
}

void Communicator::reduce_scatter(CommGroup group, Tensor input, Tensor output, const OpTag& tag) {
  wait_on(reduce_scatter_async(group, input, output, tag));
}

void Communicator::broadcast(CommGroup group, Tensor tensor, int root_in_group, const OpTag& tag) {
  if (size(group) <= 1) return;
  require_contiguous(tensor, "broadcast");
  record(OpKind::kBroadcast, group, logical_bytes(tensor), tensor.dtype, tag);
  wait_on(do_broadcast(group, tensor, root_in_group));
}

void Communicator::all_to_all(CommGroup group, Tensor input, Tensor output, const OpTag& tag) {
  const int n = size(group);
  if (input.rows != output.rows || input.cols != output.cols || input.rows % n != 0)
    throw std::logic_error("all_to_all: input and output must have one shape, rows divisible by the size");
  const std::vector<std::int64_t> blocks(static_cast<std::size_t>(n), input.rows / n);
  all_to_all(group, input, blocks, output, blocks, tag);
}

void Communicator::all_to_all(CommGroup group, Tensor input, const std::vector<std::int64_t>& send_rows,
                              Tensor output, const std::vector<std::int64_t>& receive_rows,
                              const OpTag& tag) {
  const int n = size(group);
  if (static_cast<int>(send_rows.size()) != n || static_cast<int>(receive_rows.size()) != n)
    throw std::logic_error("all_to_all: one send and one receive count per member");
  std::int64_t sent = 0, received = 0;
  for (int j = 0; j < n; ++j) {
    if (send_rows[j] < 0 || receive_rows[j] < 0) throw std::logic_error("all_to_all: negative row count");
    sent += send_rows[j];
    received += receive_rows[j];
  }
  if (input.cols != output.cols || sent > input.rows || received > output.rows)
    throw std::logic_error("all_to_all: the counts exceed the tensors' rows, or their columns differ");
  input.rows = sent;
  output.rows = received;
  if (n <= 1) {
    if (input.data != output.data && sent > 0) backend_.copy(input, output);
    return;
  }
  require_contiguous(input, "all_to_all");
  require_contiguous(output, "all_to_all");
  record(OpKind::kAllToAll, group, logical_bytes(input), input.dtype, tag);
  wait_on(do_all_to_all(group, input, send_rows, output, receive_rows));
}

void Communicator::batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) {
  wait_on(batch_p2p_async(group, transfers));
}

CommHandle Communicator::batch_p2p_async(CommGroup group, const std::vector<P2pTransferArgs>& transfers) {
  if (transfers.empty()) return nullptr;
  // Recorded sends first, then receives (the order of layouts::build_step_program).
  for (int pass = 0; pass < 2; ++pass)
    for (const P2pTransferArgs& t : transfers) {
      if (t.send != (pass == 0)) continue;
      require_contiguous(t.tensor, "batch_p2p");
      record(t.send ? OpKind::kSend : OpKind::kRecv, group, logical_bytes(t.tensor), t.tensor.dtype, t.tag,
             t.peer_rank, t.microbatch, t.chunk);
    }
  return do_batch_p2p(group, transfers);
}

void SingleRankCommunicator::abort(const std::string& message) { throw std::runtime_error(message); }

CommHandle SingleRankCommunicator::do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& t) {
  throw std::logic_error(std::string("point-to-point transfer with rank ") +
                         std::to_string(t.front().peer_rank) + " over group " +
                         layouts::comm_group_name(group) + " in a single-rank run");
}

}  // namespace megatune::executor
