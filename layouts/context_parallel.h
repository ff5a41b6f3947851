// Context parallelism's facts shared by the step program and the executor: Megatron's load-balanced split of
// the sequence (megatron.md §4) and the ring attention of cp_comm_type p2p (TransformerEngine's
// AttnFuncWithCPAndKVP2P): which block of the causal mask each ring step computes and what its transfer
// carries.
//
// Split: the sequence in 2 cp chunks of c = s / (2 cp) tokens; CP rank r holds chunks r and 2 cp - 1 - r, in
// that order, as its local sequence of 2c tokens (queries [0, c) are the first chunk, [c, 2c) the second).
//
// Ring, forward: step i holds the K,V of CP rank (r - i) mod cp; steps before the last send the held block to
// rank r + 1 and receive the next from rank r - 1 while its attention runs. Backward, in reverse: step i
// holds the K,V of rank (r + 1 + i) mod cp (the forward's last block is kept for it), sends to rank r - 1 and
// receives from rank r + 1; the block's dK,dV partial sum travels with it and reaches its owner after the
// last step. Per (query rank r, key rank j): j == r: the own chunks, causal (kDiagonal); j < r: every query
// attends the first chunk of j (all keys < r c) and none of the second (kFirstHalfKeys, no mask); j > r: only
// the second query chunk attends, both chunks of j, unmasked (kSecondHalfQueries).
#pragma once
#include <cstdint>

namespace megatune::layouts {

enum class RingBlock : std::uint8_t { kDiagonal, kFirstHalfKeys, kSecondHalfQueries };

// The block a query rank computes against the keys of key_rank.
RingBlock ring_block(int cp_rank, int key_rank);
// Key rank of ring step `step` on CP rank `cp_rank` of `cp`.
int ring_forward_key_rank(int cp, int cp_rank, int step);
int ring_backward_key_rank(int cp, int cp_rank, int step);

// What the transfer posted at a ring step carries: nothing (the forward's last step), the held K,V block, the
// K,V block with the dK,dV partial sum of the previous step's block (one tensor, twice the bytes), or the
// dK,dV partial sum alone (the backward's last step).
enum class RingPayload : std::uint8_t { kNone, kKv, kKvAndDkv, kDkv };
RingPayload ring_forward_payload(int cp, int step);
RingPayload ring_backward_payload(int cp, int step);

// Queries and keys (per sequence) of a block, as offsets into the local sequence of 2c tokens.
struct RingBlockSpan {
  std::int64_t query_begin = 0, queries = 0;
  std::int64_t key_begin = 0, keys = 0;
  bool causal = false;
};
RingBlockSpan ring_block_span(RingBlock block, std::int64_t local_seq);

// Bytes of a rank's packed K,V block: tokens x 2 kv_heads head_dim values of act_bytes (K then V per token).
std::int64_t context_parallel_kv_bytes(std::int64_t tokens, std::int64_t kv_heads, std::int64_t head_dim,
                                       std::int64_t act_bytes);
// Bytes one log-sum-exp merge of a block's partial output moves for `rows` query rows: the running output and
// the block's read, the output written (heads * head_dim values of act_bytes each), and likewise the fp32
// log-sum-exp per (row, head).
std::int64_t attention_merge_bytes(std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                   std::int64_t act_bytes);

// Global position of local token `index` (0 <= index < seq / cp) on CP rank `cp_rank`.
std::int64_t context_parallel_position(std::int64_t seq, int cp, int cp_rank, std::int64_t index);

}  // namespace megatune::layouts
