// CudaKernelRunner: flash attention forward and backward benchmarks (executor/cuda/flash_attention.h).
#include "executor/cuda/flash_attention.h"
#include "profiler/cuda/cuda_kernel_runner.h"
#include "profiler/cuda/device_fill.h"

namespace megatune::profiler::cuda {

namespace ec = executor::cuda;

TimingSamples CudaKernelRunner::time_attention(const AttentionItem& item, const RepeatPolicy& policy) {
  const layouts::AttentionShape& s = item.shape;
  if (item.dtype != layouts::DType::kBF16 || s.seq_q != s.seq_kv || s.kv_heads <= 0) return std::nullopt;
  executor::AttentionShape shape;
  shape.batch = s.batch;
  shape.seq_q = s.seq_q;
  shape.num_heads = s.heads;
  shape.num_kv_heads = s.kv_heads;
  shape.head_dim = s.head_dim;
  shape.causal = s.causal;
  if (!ec::flash_attention_supports(shape)) return std::nullopt;

  const std::int64_t tokens = shape.batch * shape.seq_q;
  const std::int64_t qkv_elements = tokens * shape.packed_token_stride();
  const std::int64_t o_elements = tokens * shape.num_heads * shape.head_dim;
  const std::int64_t lse_elements = shape.batch * shape.num_heads * shape.seq_q;
  const std::size_t workspace_bytes = item.backward ? ec::flash_attention_backward_workspace_bytes(shape) : 0;
  arena_.begin(DeviceArena::rounded(qkv_elements * 2) * 2 + DeviceArena::rounded(o_elements * 2) * 2 +
               DeviceArena::rounded(lse_elements * 4) + DeviceArena::rounded(workspace_bytes));
  auto* qkv = arena_.take<ec::bf16>(qkv_elements);
  auto* dqkv = arena_.take<ec::bf16>(qkv_elements);
  auto* o = arena_.take<ec::bf16>(o_elements);
  auto* d_o = arena_.take<ec::bf16>(o_elements);
  auto* lse = arena_.take<float>(lse_elements);
  void* workspace = workspace_bytes > 0 ? arena_.take(workspace_bytes) : nullptr;
  fill_uniform_bf16(qkv, qkv_elements, -1.0f, 1.0f, fill_seed_++, stream_);
  fill_uniform_bf16(d_o, o_elements, -1.0f, 1.0f, fill_seed_++, stream_);
  const ec::bf16* q = qkv;
  const ec::bf16* k = qkv + shape.packed_k_offset();
  const ec::bf16* v = qkv + shape.packed_v_offset();
  if (!item.backward) {
    return time_launches([&] { ec::flash_attention_forward(shape, q, k, v, o, lse, stream_); }, policy);
  }
  ec::flash_attention_forward(shape, q, k, v, o, lse, stream_);  // the backward reads o and lse
  return time_launches(
      [&] {
        ec::flash_attention_backward(shape, q, k, v, o, lse, d_o, dqkv, dqkv + shape.packed_k_offset(),
                                     dqkv + shape.packed_v_offset(), workspace, workspace_bytes, stream_);
      },
      policy);
}

}  // namespace megatune::profiler::cuda
