// Context parallelism: the load-balanced split and the ring's blocks and payloads (see context_parallel.h).
#include "layouts/context_parallel.h"

#include <stdexcept>

namespace megatune::layouts {
namespace {

int wrap(int rank, int cp) { return ((rank % cp) + cp) % cp; }

void check_step(int cp, int cp_rank, int step) {
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp || step < 0 || step >= cp)
    throw std::out_of_range("context-parallel ring: rank or step outside the group");
}

}  // namespace

RingBlock ring_block(int cp_rank, int key_rank) {
  if (key_rank == cp_rank) return RingBlock::kDiagonal;
  return key_rank < cp_rank ? RingBlock::kFirstHalfKeys : RingBlock::kSecondHalfQueries;
}

int ring_forward_key_rank(int cp, int cp_rank, int step) {
  check_step(cp, cp_rank, step);
  return wrap(cp_rank - step, cp);
}

int ring_backward_key_rank(int cp, int cp_rank, int step) {
  check_step(cp, cp_rank, step);
  return wrap(cp_rank + 1 + step, cp);
}

RingPayload ring_forward_payload(int cp, int step) {
  return step + 1 < cp ? RingPayload::kKv : RingPayload::kNone;
}

RingPayload ring_backward_payload(int cp, int step) {
  if (cp < 2) return RingPayload::kNone;
  if (step == 0) return RingPayload::kKv;
  return step + 1 < cp ? RingPayload::kKvAndDkv : RingPayload::kDkv;
}

RingBlockSpan ring_block_span(RingBlock block, std::int64_t local_seq) {
  const std::int64_t half = local_seq / 2;
  switch (block) {
    case RingBlock::kDiagonal:
      return {0, local_seq, 0, local_seq, true};
    case RingBlock::kFirstHalfKeys:
      return {0, local_seq, 0, half, false};
    case RingBlock::kSecondHalfQueries:
      return {half, half, 0, local_seq, false};
  }
  return {};
}

std::int64_t context_parallel_kv_bytes(std::int64_t tokens, std::int64_t kv_heads, std::int64_t head_dim,
                                       std::int64_t act_bytes) {
  return 2 * tokens * kv_heads * head_dim * act_bytes;
}

std::int64_t attention_merge_bytes(std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                   std::int64_t act_bytes) {
  return 3 * rows * heads * (head_dim * act_bytes + 4);
}

std::int64_t context_parallel_position(std::int64_t seq, int cp, int cp_rank, std::int64_t index) {
  if (cp <= 1) return index;
  const std::int64_t chunk = seq / (2 * cp);
  return index < chunk ? cp_rank * chunk + index : (2 * cp - 1 - cp_rank) * chunk + (index - chunk);
}

}  // namespace megatune::layouts
