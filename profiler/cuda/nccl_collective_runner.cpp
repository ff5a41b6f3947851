// NcclCollectiveRunner: NCCL collectives timed through the Tracer (and by CUDA events for checks).
#include "profiler/cuda/nccl_collective_runner.h"

#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/nccl_check.h"
#include "executor/cuda/nccl_communicator.h"
#include "profiler/cuda/device_fill.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler::cuda {
namespace {

using cost_models::CollectiveOp;

// Elements (bf16) per rank-local piece, rounded so that every rank's share is whole.
std::size_t piece_elements(const CollectiveItem& item) {
  const std::size_t elements = std::size_t(item.bytes) / 2;
  switch (item.op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return std::max<std::size_t>(1, elements / item.group_size);
    default:
      return std::max<std::size_t>(1, elements);
  }
}

}  // namespace

NcclCollectiveRunner::NcclCollectiveRunner(Tracer& tracer, int rank, int world_size, const ncclUniqueId& id,
                                           cudaStream_t stream, std::uint64_t first_range_id)
    : tracer_(tracer), rank_(rank), world_size_(world_size), stream_(stream), next_range_id_(first_range_id) {
  world_ = executor::cuda::init_world_communicator(world_size, rank,
                                                   std::string(id.internal, sizeof(id.internal)));
}

NcclCollectiveRunner::~NcclCollectiveRunner() {
  cudaStreamSynchronize(stream_);
  for (auto& [size, comm] : groups_) {
    if (comm != nullptr && comm != world_) ncclCommDestroy(comm);
  }
  if (world_ != nullptr) ncclCommDestroy(world_);
}

ncclComm_t NcclCollectiveRunner::comm_for(int group_size) {
  if (group_size == world_size_) return world_;
  const auto found = groups_.find(group_size);
  if (found != groups_.end()) return found->second;
  std::vector<int> members(static_cast<std::size_t>(group_size));  // the first group_size ranks
  for (int r = 0; r < group_size; ++r) members[r] = r;
  ncclComm_t comm = executor::cuda::split_communicator(world_, rank_, members, /*single_member_too=*/true);
  groups_[group_size] = comm;
  return comm;
}

NcclCollectiveRunner::Buffers NcclCollectiveRunner::prepare(const CollectiveItem& item) {
  const std::size_t piece = piece_elements(item);
  const std::size_t g = std::size_t(item.group_size);
  std::size_t send_elements = piece, recv_elements = piece;
  switch (item.op) {
    case CollectiveOp::kAllGather:
      recv_elements = piece * g;
      break;
    case CollectiveOp::kReduceScatter:
      send_elements = piece * g;
      break;
    case CollectiveOp::kAllToAll:
      send_elements = recv_elements = piece * g;
      break;
    default:
      break;
  }
  arena_.begin(DeviceArena::rounded(send_elements * 2) + DeviceArena::rounded(recv_elements * 2));
  Buffers buffers;
  buffers.send = arena_.take(send_elements * 2);
  buffers.recv = arena_.take(recv_elements * 2);
  fill_uniform_bf16(buffers.send, std::int64_t(send_elements), -1.0f, 1.0f, fill_seed_++ * 131 + rank_,
                    stream_);
  return buffers;
}

void NcclCollectiveRunner::launch(const CollectiveItem& item, ncclComm_t comm, const Buffers& b) {
  const std::size_t piece = piece_elements(item);
  const int g = item.group_size;
  switch (item.op) {
    case CollectiveOp::kAllReduce:
      MEGATUNE_NCCL_CHECK(ncclAllReduce(b.send, b.recv, piece, ncclBfloat16, ncclSum, comm, stream_));
      break;
    case CollectiveOp::kAllGather:
      MEGATUNE_NCCL_CHECK(ncclAllGather(b.send, b.recv, piece, ncclBfloat16, comm, stream_));
      break;
    case CollectiveOp::kReduceScatter:
      MEGATUNE_NCCL_CHECK(ncclReduceScatter(b.send, b.recv, piece, ncclBfloat16, ncclSum, comm, stream_));
      break;
    case CollectiveOp::kBroadcast:
      MEGATUNE_NCCL_CHECK(ncclBroadcast(b.send, b.recv, piece, ncclBfloat16, 0, comm, stream_));
      break;
    case CollectiveOp::kAllToAll: {
      MEGATUNE_NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < g; ++peer) {
        MEGATUNE_NCCL_CHECK(ncclSend(static_cast<char*>(b.send) + piece * 2 * peer, piece, ncclBfloat16, peer,
                                     comm, stream_));
        MEGATUNE_NCCL_CHECK(ncclRecv(static_cast<char*>(b.recv) + piece * 2 * peer, piece, ncclBfloat16, peer,
                                     comm, stream_));
      }
      MEGATUNE_NCCL_CHECK(ncclGroupEnd());
      break;
    }
    case CollectiveOp::kSendRecv: {
      const int next = (rank_ + 1) % g, previous = (rank_ - 1 + g) % g;
      MEGATUNE_NCCL_CHECK(ncclGroupStart());
      MEGATUNE_NCCL_CHECK(ncclSend(b.send, piece, ncclBfloat16, next, comm, stream_));
      MEGATUNE_NCCL_CHECK(ncclRecv(b.recv, piece, ncclBfloat16, previous, comm, stream_));
      MEGATUNE_NCCL_CHECK(ncclGroupEnd());
      break;
    }
  }
}

void NcclCollectiveRunner::barrier() {
  arena_.begin(512);
  void* one = arena_.take(256);
  MEGATUNE_CUDA_CHECK(cudaMemsetAsync(one, 0, 256, stream_));
  MEGATUNE_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, world_, stream_));
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

TimingSamples NcclCollectiveRunner::time_collective(const CollectiveItem& item, const RepeatPolicy& policy) {
  if (item.group_size < 1 || item.group_size > world_size_) return std::nullopt;
  ncclComm_t comm = comm_for(item.group_size);
  if (rank_ >= item.group_size) return std::nullopt;
  const Buffers buffers = prepare(item);
  for (int i = 0; i < policy.warmup; ++i) launch(item, comm, buffers);
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  tracer_.flush();
  std::vector<std::uint64_t> ids;
  for (int r = 0; r < policy.repeats; ++r) {
    const std::uint64_t id = next_range_id_++;
    ids.push_back(id);
    TraceRange range(tracer_, id);
    launch(item, comm, buffers);
  }
  return range_busy_seconds(tracer_.flush(), ids);
}

std::optional<double> NcclCollectiveRunner::event_timed_seconds(const CollectiveItem& item, int warmup,
                                                                int iterations) {
  if (item.group_size < 1 || item.group_size > world_size_ || iterations < 1) return std::nullopt;
  ncclComm_t comm = comm_for(item.group_size);
  if (rank_ >= item.group_size) return std::nullopt;
  const Buffers buffers = prepare(item);
  for (int i = 0; i < warmup; ++i) launch(item, comm, buffers);
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaEvent_t start = nullptr, stop = nullptr;
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&start));
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&stop));
  MEGATUNE_CUDA_CHECK(cudaEventRecord(start, stream_));
  for (int i = 0; i < iterations; ++i) launch(item, comm, buffers);
  MEGATUNE_CUDA_CHECK(cudaEventRecord(stop, stream_));
  MEGATUNE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  tracer_.flush();
  return double(ms) * 1e-3 / iterations;
}

}  // namespace megatune::profiler::cuda
