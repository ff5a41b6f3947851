// Embedding lookup (word + optional learned position) in bf16 and its deterministic backward: token ids
// are stably sorted (CUB radix sort), then each distinct id's rows are summed in token order into the fp32
// main grad. Same math as reference_embedding.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// out [tokens, hidden] = word[ids[t]] (+ position[t % seq_len]); hidden a multiple of 8. Ids outside
// [0, vocab) produce zero rows (and are counted by the caller's data checks, not here).
void embedding_forward(const int32_t* ids, const bf16* word, const bf16* position, bf16* out, int64_t tokens,
                       int64_t seq_len, int64_t vocab, int64_t hidden, cudaStream_t stream);

// The same from fp32 tables (the fp32 main parameters, when the model keeps no bf16 copy of them).
void embedding_forward(const int32_t* ids, const float* word, const float* position, bf16* out,
                       int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden, cudaStream_t stream);

size_t embedding_backward_workspace_bytes(int64_t tokens, int64_t vocab);

// d_word [vocab, hidden] fp32 += per-id sums of d_out [tokens, hidden]; d_position [seq_len, hidden] fp32 +=
// per-position sums (when not null). Deterministic (no float atomics).
void embedding_backward(const int32_t* ids, const bf16* d_out, float* d_word, float* d_position,
                        int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream);

}  // namespace megatune::executor::cuda
