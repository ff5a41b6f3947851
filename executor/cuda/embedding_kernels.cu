// Embedding lookup and its deterministic backward (stable CUB radix sort of the ids, then one block per
// distinct id sums its rows in token order).
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/embedding_kernels.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

using detail::Bf16x8;

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

__device__ __forceinline__ void load8(const bf16* p, float (&out)[8]) {
  detail::unpack(*reinterpret_cast<const Bf16x8*>(p), out);
}

__device__ __forceinline__ void load8(const float* p, float (&out)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z,
  out[7] = b.w;
}

// One block per token; 8 columns (16 or 32 bytes of the table) per access. Table: bf16 or fp32.
template <typename Table>
__global__ void embedding_forward_kernel(const int32_t* ids, const Table* word, const Table* position,
                                         bf16* out, int64_t seq_len, int64_t vocab, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const Table* w = word + int64_t(valid ? id : 0) * hidden;
  const Table* p = position ? position + (t % seq_len) * hidden : nullptr;
  auto* o = reinterpret_cast<Bf16x8*>(out + t * hidden);
  for (int64_t v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8];
    if (valid) load8(w + 8 * v, a);
    if (p) {
      load8(p + 8 * v, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += b[i];
    }
    o[v] = detail::pack(a);
  }
}

__global__ void iota_kernel(int32_t* values, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    values[i] = int32_t(i);
}

// One block per sorted position; the block that starts a run of equal ids sums the run's rows (token order,
// since the sort is stable) and adds them to d_word[id].
__global__ void embedding_word_grad_kernel(const int32_t* sorted_ids, const int32_t* sorted_tokens,
                                           const bf16* d_out, float* d_word, int64_t tokens, int64_t vocab,
                                           int64_t hidden) {
  const int64_t start = blockIdx.x;
  const int32_t id = sorted_ids[start];
  if (id < 0 || id >= vocab) return;
  if (start > 0 && sorted_ids[start - 1] == id) return;
  int64_t end = start;
  while (end < tokens && sorted_ids[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float sum = 0.0f;
    for (int64_t j = start; j < end; ++j)
      sum += __bfloat162float(d_out[int64_t(sorted_tokens[j]) * hidden + c]);
    d_word[int64_t(id) * hidden + c] += sum;
  }
}

__global__ void embedding_position_grad_kernel(const bf16* d_out, float* d_position, int64_t tokens,
                                               int64_t seq_len, int64_t hidden) {
  const int64_t p = blockIdx.x;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float sum = 0.0f;
    for (int64_t t = p; t < tokens; t += seq_len) sum += __bfloat162float(d_out[t * hidden + c]);
    d_position[p * hidden + c] += sum;
  }
}

size_t cub_temp_bytes(int64_t tokens) {
  size_t bytes = 0;
  MEGATUNE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(tokens)));
  return bytes;
}

}  // namespace

void embedding_forward(const int32_t* ids, const bf16* word, const bf16* position, bf16* out, int64_t tokens,
                       int64_t seq_len, int64_t vocab, int64_t hidden, cudaStream_t stream) {
  if (hidden % 8 != 0) throw std::invalid_argument("embedding_forward: hidden must be a multiple of 8");
  if (tokens <= 0) return;
  embedding_forward_kernel<<<unsigned(tokens), 128, 0, stream>>>(ids, word, position, out, seq_len, vocab,
                                                                 hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void embedding_forward(const int32_t* ids, const float* word, const float* position, bf16* out,
                       int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden, cudaStream_t stream) {
  if (hidden % 8 != 0 || !detail::aligned16(word) || (position != nullptr && !detail::aligned16(position)))
    throw std::invalid_argument("embedding_forward: hidden must be a multiple of 8, tables 16-byte aligned");
  if (tokens <= 0) return;
  embedding_forward_kernel<<<unsigned(tokens), 128, 0, stream>>>(ids, word, position, out, seq_len, vocab,
                                                                 hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

size_t embedding_backward_workspace_bytes(int64_t tokens, int64_t /*vocab*/) {
  return 3 * align256(size_t(tokens) * sizeof(int32_t)) + align256(cub_temp_bytes(tokens));
}

void embedding_backward(const int32_t* ids, const bf16* d_out, float* d_word, float* d_position,
                        int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream) {
  if (tokens <= 0) return;
  if (tokens > int64_t(INT32_MAX)) throw std::invalid_argument("embedding_backward: too many tokens");
  if (workspace_bytes < embedding_backward_workspace_bytes(tokens, vocab))
    throw std::invalid_argument(
        "embedding_backward: workspace smaller than embedding_backward_workspace_bytes()");
  auto* bytes = static_cast<char*>(workspace);
  const size_t ids_bytes = align256(size_t(tokens) * sizeof(int32_t));
  auto* sorted_ids = reinterpret_cast<int32_t*>(bytes);
  auto* token_index = reinterpret_cast<int32_t*>(bytes + ids_bytes);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(bytes + 2 * ids_bytes);
  void* temp = bytes + 3 * ids_bytes;
  size_t temp_bytes = workspace_bytes - 3 * ids_bytes;
  iota_kernel<<<detail::grid_for(tokens, 256), 256, 0, stream>>>(token_index, tokens);
  MEGATUNE_CUDA_CHECK_LAUNCH();
  MEGATUNE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, sorted_ids, token_index,
                                                      sorted_tokens, int(tokens), 0, 32, stream));
  embedding_word_grad_kernel<<<unsigned(tokens), 256, 0, stream>>>(sorted_ids, sorted_tokens, d_out, d_word,
                                                                   tokens, vocab, hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
  if (d_position != nullptr) {
    embedding_position_grad_kernel<<<unsigned(seq_len), 256, 0, stream>>>(d_out, d_position, tokens, seq_len,
                                                                          hidden);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace megatune::executor::cuda
