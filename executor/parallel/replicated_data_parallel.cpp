// ReplicatedDataParallel: the whole main parameters as training state.
#include "executor/parallel/replicated_data_parallel.h"

#include <stdexcept>
#include <string>

namespace megatune::executor {

ReplicatedDataParallel::ReplicatedDataParallel(
    Communicator& communicator, std::vector<DataParallelChunk> chunks,
    const std::vector<std::vector<layouts::GradBucket>>& step_buckets, const DataParallelOptions& options,
    bool sizing)
    : DataParallelStrategy(communicator, std::move(chunks), step_buckets, options,
                           /*shard_optimizer_state=*/false, sizing) {
  for (const Chunk& chunk : chunks_)
    if (chunk.buffers.main_params.cols < chunk.buffers.total_elements())
      throw std::invalid_argument("ReplicatedDataParallel: a chunk without its whole fp32 main parameters");
}

std::vector<float> ReplicatedDataParallel::main_parameters(int chunk) {
  const DataParallelChunk& b = chunks_.at(chunk).buffers;
  std::vector<float> host(static_cast<std::size_t>(b.main_params.cols));
  backend_.download(b.main_params, host.data());
  host.resize(static_cast<std::size_t>(b.total_elements()));
  return host;
}

void ReplicatedDataParallel::set_main_parameters(int chunk, const std::vector<float>& values) {
  const DataParallelChunk& b = chunks_.at(chunk).buffers;
  if (static_cast<std::int64_t>(values.size()) != b.main_params.cols)
    throw std::invalid_argument("set_main_parameters: " + std::to_string(values.size()) +
                                " values for a buffer of " + std::to_string(b.main_params.cols));
  backend_.upload(b.main_params, values.data());
  if (b.model_params.data != b.main_params.data)  // the copy holds the buffer's first elements
    backend_.copy(flat_range(backend_, b.main_params, 0, b.model_params.cols), b.model_params);
}

}  // namespace megatune::executor
