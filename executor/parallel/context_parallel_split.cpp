// Context parallelism's load-balanced split of a micro-batch.
#include "executor/parallel/context_parallel_split.h"

#include <stdexcept>
#include <string>

#include "layouts/context_parallel.h"

namespace megatune::executor {
namespace {

template <typename T>
void keep_chunks(const std::vector<T>& full, std::int64_t sequences, std::int64_t seq, int cp, int cp_rank,
                 std::vector<T>& local) {
  const std::int64_t local_seq = seq / cp;
  local.resize(static_cast<std::size_t>(sequences * local_seq));
  for (std::int64_t b = 0; b < sequences; ++b)
    for (std::int64_t i = 0; i < local_seq; ++i)
      local[b * local_seq + i] = full[b * seq + layouts::context_parallel_position(seq, cp, cp_rank, i)];
}

}  // namespace

void context_parallel_slice(const data::MicroBatch& full, int cp, int cp_rank, data::MicroBatch& local) {
  const std::int64_t seq = full.sequence_length, sequences = full.micro_batch_size;
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp || seq % (2 * cp) != 0)
    throw std::invalid_argument("context_parallel_slice: sequence length " + std::to_string(seq) +
                                " does not split into 2 x " + std::to_string(cp) + " chunks");
  if (static_cast<std::int64_t>(full.tokens.size()) != sequences * seq)
    throw std::invalid_argument("context_parallel_slice: micro-batch tokens do not match its shape");
  local.micro_batch_size = sequences;
  local.sequence_length = seq / cp;
  local.sample_indices = full.sample_indices;
  keep_chunks(full.tokens, sequences, seq, cp, cp_rank, local.tokens);
  if (!full.labels.empty()) keep_chunks(full.labels, sequences, seq, cp, cp_rank, local.labels);
  if (!full.loss_mask.empty()) keep_chunks(full.loss_mask, sequences, seq, cp, cp_rank, local.loss_mask);
}

SequencePositions context_parallel_positions(std::int64_t seq, int cp, int cp_rank) {
  if (cp <= 1) return {};
  const std::int64_t chunk = seq / (2 * cp);
  return {{0, chunk, layouts::context_parallel_position(seq, cp, cp_rank, 0)},
          {chunk, chunk, layouts::context_parallel_position(seq, cp, cp_rank, chunk)}};
}

}  // namespace megatune::executor
