// CPU reference token (+ learned position) embedding lookup and its deterministic scatter-add backward.
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// out [tokens, hidden] = word[ids[t]] (+ position[t % seq_len] when position != nullptr).
// ids [tokens] below vocab (checked: std::out_of_range); a negative id (a token of another rank's vocabulary
// slice) gives a zero word row and no word gradient. tokens = batch * seq_len, token-major.
void embedding_forward(const int32_t* ids, const float* word, const float* position, float* out,
                       int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden);

// d_word [vocab, hidden] += sum of d_out rows per id (in token order); d_position [seq_len, hidden] += sum
// over the batch when not nullptr. Always accumulates (gradients live in fp32 main-grad buffers).
void embedding_backward(const int32_t* ids, const float* d_out, float* d_word, float* d_position,
                        int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden);

}  // namespace megatune::executor::reference
