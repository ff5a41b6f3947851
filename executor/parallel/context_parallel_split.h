// Context parallelism's load-balanced split of a micro-batch (megatron.md §4, layouts/context_parallel.h):
// CP rank r keeps chunks r and 2 cp - 1 - r of every sequence's tokens, labels and loss mask, and the global
// positions of what it keeps (RoPE and learned position embeddings follow them).
#pragma once
#include <cstdint>

#include "executor/backend/backend.h"
#include "executor/data/data_loader.h"

namespace megatune::executor {

// Fills `local` (buffers reused) with CP rank `cp_rank`'s share of `full`: micro_batch_size sequences of
// sequence_length / cp tokens. Throws std::invalid_argument when the length does not split into 2 cp chunks.
void context_parallel_slice(const data::MicroBatch& full, int cp, int cp_rank, data::MicroBatch& local);

// The two runs of global positions of the rank's local sequence (empty for cp == 1: positions 0 .. s - 1).
SequencePositions context_parallel_positions(std::int64_t seq, int cp, int cp_rank);

}  // namespace megatune::executor
