// CudaKernelRunner: memory-bound kernel benchmarks. Each item's bytes follow the step program's accounting
// (layouts/step_program.cpp) for its kind; the row count is chosen so the kernel moves that many bytes with
// rows of `columns` elements.
#include <algorithm>
#include <memory>

#include "executor/cuda/activation_kernels.h"
#include "executor/cuda/cross_entropy_kernels.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/elementwise_kernels.h"
#include "executor/cuda/embedding_kernels.h"
#include "executor/cuda/fp8_kernels.h"
#include "executor/cuda/norm_kernels.h"
#include "executor/cuda/optimizer_kernels.h"
#include "executor/cuda/rope_kernels.h"
#include "profiler/cuda/cuda_kernel_runner.h"
#include "profiler/cuda/device_fill.h"

namespace megatune::profiler::cuda {

namespace ec = executor::cuda;
using layouts::OpKind;

namespace {
std::int64_t at_least_one(std::int64_t value) { return std::max<std::int64_t>(1, value); }
}  // namespace

// An FP8 cast (MemoryBoundItem::is_fp8_cast) of a (elements / columns, columns) bf16 tensor through the
// executor's kernel: delayed scaling updates its state and casts, current scaling reduces the amax first.
TimingSamples CudaKernelRunner::time_fp8_cast(const MemoryBoundItem& item, const RepeatPolicy& policy) {
  const std::int64_t cols = item.columns > 0 ? item.columns : 1024;
  const std::int64_t rows = at_least_one(item.cast_elements() / cols);
  const std::int64_t state_elements = 64;
  arena_.begin(DeviceArena::rounded(rows * cols * 2) + 2 * DeviceArena::rounded(rows * cols) +
               DeviceArena::rounded(state_elements * 4));
  auto* src = arena_.take<ec::bf16>(rows * cols);
  auto* out = arena_.take<std::uint8_t>(rows * cols);
  auto* out_t = arena_.take<std::uint8_t>(rows * cols);
  auto* state = arena_.take<float>(state_elements);
  fill_uniform_bf16(src, rows * cols, -2.0f, 2.0f, fill_seed_++, stream_);
  MEGATUNE_CUDA_CHECK(cudaMemsetAsync(state, 0, state_elements * 4, stream_));
  ec::Fp8CastLaunch cast;
  cast.src = src;
  cast.rows = rows, cast.cols = cols, cast.ld = cols;
  cast.out = out;
  cast.out_t = item.cast_outputs > 1 ? out_t : nullptr;
  cast.state = state;
  cast.current_scaling = item.cast_current_scaling;
  return time_launches([&] { ec::fp8_cast(cast, stream_); }, policy);
}

TimingSamples CudaKernelRunner::time_memory_bound(const MemoryBoundItem& item, const RepeatPolicy& policy) {
  const std::int64_t bytes = item.bytes;
  const std::int64_t cols = item.columns;
  const executor::NormKind norm_kind =
      item.rms_norm ? executor::NormKind::kRMSNorm : executor::NormKind::kLayerNorm;
  switch (item.kind) {
    case OpKind::kNorm:
    case OpKind::kNormBackward: {
      if (cols <= 0 || !ec::norm_supports(cols)) return std::nullopt;
      const bool backward = item.kind == OpKind::kNormBackward;
      const std::int64_t rows = at_least_one(bytes / ((backward ? 6 : 4) * cols));  // 2 or 3 bf16 tensors
      const std::size_t workspace = backward ? ec::norm_backward_workspace_bytes(rows, cols) : 0;
      arena_.begin(3 * DeviceArena::rounded(rows * cols * 2) + 2 * DeviceArena::rounded(rows * 4) +
                   DeviceArena::rounded(cols * 2) * 2 + DeviceArena::rounded(cols * 4) * 2 +
                   DeviceArena::rounded(workspace));
      auto* x = arena_.take<ec::bf16>(rows * cols);
      auto* y = arena_.take<ec::bf16>(rows * cols);
      auto* dx = arena_.take<ec::bf16>(rows * cols);
      auto* mean = arena_.take<float>(rows);
      auto* rstd = arena_.take<float>(rows);
      auto* gamma = arena_.take<ec::bf16>(cols);
      auto* beta = arena_.take<ec::bf16>(cols);
      auto* dgamma = arena_.take<float>(cols);
      auto* dbeta = arena_.take<float>(cols);
      void* ws = workspace > 0 ? arena_.take(workspace) : nullptr;
      fill_uniform_bf16(x, rows * cols, -2.0f, 2.0f, fill_seed_++, stream_);
      fill_uniform_bf16(y, rows * cols, -1.0f, 1.0f, fill_seed_++, stream_);
      fill_uniform_bf16(gamma, cols, 0.5f, 1.5f, fill_seed_++, stream_);
      fill_uniform_bf16(beta, cols, -0.1f, 0.1f, fill_seed_++, stream_);
      const bool layer = norm_kind == executor::NormKind::kLayerNorm;
      ec::norm_forward(norm_kind, x, nullptr, gamma, layer ? beta : nullptr, dx, nullptr, mean, rstd, rows,
                       cols, 1e-5f, stream_);
      if (!backward) {
        return time_launches(
            [&] {
              ec::norm_forward(norm_kind, x, nullptr, gamma, layer ? beta : nullptr, y, nullptr,
                               layer ? mean : nullptr, rstd, rows, cols, 1e-5f, stream_);
            },
            policy);
      }
      return time_launches(
          [&] {
            ec::norm_backward(norm_kind, y, x, gamma, layer ? mean : nullptr, rstd, nullptr, dx, dgamma,
                              layer ? dbeta : nullptr, rows, cols, false, ws, workspace, stream_);
          },
          policy);
    }
    case OpKind::kActivation:
    case OpKind::kActivationBackward: {
      if (cols <= 0) return std::nullopt;
      const bool backward = item.kind == OpKind::kActivationBackward;
      // Step program: forward tokens * (glu + 1) * f * 2, backward tokens * (2 glu + 1) * f * 2.
      const std::int64_t per_row = item.swiglu ? (backward ? 10 : 6) * cols : (backward ? 6 : 4) * cols;
      const std::int64_t rows = at_least_one(bytes / per_row);
      const std::int64_t in_cols = item.swiglu ? 2 * cols : cols;
      arena_.begin(2 * DeviceArena::rounded(rows * in_cols * 2) + DeviceArena::rounded(rows * cols * 2));
      auto* x = arena_.take<ec::bf16>(rows * in_cols);
      auto* dx = arena_.take<ec::bf16>(rows * in_cols);
      auto* y = arena_.take<ec::bf16>(rows * cols);
      fill_uniform_bf16(x, rows * in_cols, -3.0f, 3.0f, fill_seed_++, stream_);
      fill_uniform_bf16(y, rows * cols, -1.0f, 1.0f, fill_seed_++, stream_);
      if (item.swiglu) {
        if (backward)
          return time_launches([&] { ec::swiglu_backward(y, x, dx, rows, cols, stream_); }, policy);
        return time_launches([&] { ec::swiglu_forward(x, y, rows, cols, stream_); }, policy);
      }
      if (backward) return time_launches([&] { ec::gelu_backward(y, x, dx, rows, cols, stream_); }, policy);
      return time_launches([&] { ec::bias_gelu_forward(x, nullptr, nullptr, y, rows, cols, stream_); },
                           policy);
    }
    case OpKind::kElementwise: {
      if (item.is_fp8_cast()) return time_fp8_cast(item, policy);
      const std::int64_t n = at_least_one(bytes / 6);  // a + b -> out, bf16
      arena_.begin(3 * DeviceArena::rounded(n * 2));
      auto* a = arena_.take<ec::bf16>(n);
      auto* b = arena_.take<ec::bf16>(n);
      auto* out = arena_.take<ec::bf16>(n);
      fill_uniform_bf16(a, n, -1.0f, 1.0f, fill_seed_++, stream_);
      fill_uniform_bf16(b, n, -1.0f, 1.0f, fill_seed_++, stream_);
      return time_launches([&] { ec::add_bf16(a, b, out, n, stream_); }, policy);
    }
    case OpKind::kRope:
    case OpKind::kRopeBackward: {
      // Step program: 2 * tokens * (heads + kv_heads) * head_dim * 2 bytes; Llama-like 32 q / 8 kv heads.
      const std::int64_t head_dim = cols > 0 ? cols : 128;
      if (head_dim % 2 != 0) return std::nullopt;
      executor::AttentionShape shape;
      shape.num_heads = 32, shape.num_kv_heads = 8, shape.head_dim = head_dim;
      shape.seq_q = at_least_one(bytes / (4 * (shape.num_heads + shape.num_kv_heads) * head_dim));
      const std::int64_t elements = shape.seq_q * shape.packed_token_stride();
      arena_.begin(DeviceArena::rounded(elements * 2));
      auto* qkv = arena_.take<ec::bf16>(elements);
      fill_uniform_bf16(qkv, elements, -1.0f, 1.0f, fill_seed_++, stream_);
      ec::bf16* k = qkv + shape.packed_k_offset();
      if (item.kind == OpKind::kRopeBackward) {
        return time_launches([&] { ec::rope_backward_inplace(shape, qkv, k, 500000.0f, 0, stream_); },
                             policy);
      }
      return time_launches([&] { ec::rope_forward_inplace(shape, qkv, k, 500000.0f, 0, stream_); }, policy);
    }
    case OpKind::kCrossEntropy: {
      // Step program: 2 * tokens * vocab * 2 (logits read, gradient written in place).
      const std::int64_t vocab = cols > 0 ? cols / 8 * 8 : 128256;
      if (vocab <= 0) return std::nullopt;
      const std::int64_t tokens = at_least_one(bytes / (4 * vocab));
      arena_.begin(DeviceArena::rounded(tokens * vocab * 2) + 2 * DeviceArena::rounded(tokens * 4));
      auto* logits = arena_.take<ec::bf16>(tokens * vocab);
      auto* targets = arena_.take<std::int32_t>(tokens);
      auto* loss = arena_.take<float>(tokens);
      fill_targets_int32(targets, tokens, static_cast<std::int32_t>(vocab), fill_seed_++, stream_);
      // Each run writes the gradient over the logits, which stay finite and non-zero for the next repeat.
      fill_uniform_bf16(logits, tokens * vocab, -4.0f, 4.0f, fill_seed_++, stream_);
      return time_launches(
          [&] {
            ec::cross_entropy_forward_backward(logits, targets, loss, tokens, vocab, true, 1.0f / tokens,
                                               stream_);
          },
          policy);
    }
    case OpKind::kEmbedding: {
      // Step program: tokens * hidden * 2 + tokens * 8.
      const std::int64_t hidden = cols > 0 ? cols : 4096;
      if (hidden % 8 != 0) return std::nullopt;
      const std::int64_t vocab = 32768;
      const std::int64_t tokens = at_least_one(bytes / (2 * hidden + 8));
      arena_.begin(DeviceArena::rounded(tokens * 4) + DeviceArena::rounded(vocab * hidden * 2) +
                   DeviceArena::rounded(tokens * hidden * 2));
      auto* ids = arena_.take<std::int32_t>(tokens);
      auto* word = arena_.take<ec::bf16>(vocab * hidden);
      auto* out = arena_.take<ec::bf16>(tokens * hidden);
      fill_targets_int32(ids, tokens, static_cast<std::int32_t>(vocab), fill_seed_++, stream_);
      fill_uniform_bf16(word, vocab * hidden, -1.0f, 1.0f, fill_seed_++, stream_);
      return time_launches(
          [&] { ec::embedding_forward(ids, word, nullptr, out, tokens, tokens, vocab, hidden, stream_); },
          policy);
    }
    case OpKind::kOptimizer:
    case OpKind::kGradNorm: {
      // Step program: AdamW 30 bytes per parameter, grad norm 4.
      const bool adam = item.kind == OpKind::kOptimizer;
      const std::int64_t params = at_least_one(bytes / (adam ? 30 : 4));
      arena_.begin(4 * DeviceArena::rounded(params * 4) + DeviceArena::rounded(params * 2) + 256);
      ec::AdamWTensor tensor;
      tensor.main_param = arena_.take<float>(params);
      tensor.main_grad = arena_.take<float>(params);
      tensor.exp_avg = arena_.take<float>(params);
      tensor.exp_avg_sq = arena_.take<float>(params);
      tensor.model_param = arena_.take<ec::bf16>(params);
      tensor.numel = params;
      auto* norm = arena_.take<float>(1);
      for (float* buffer : {tensor.main_param, tensor.main_grad, tensor.exp_avg})
        fill_uniform_fp32(buffer, params, -0.5f, 0.5f, fill_seed_++, stream_);
      fill_uniform_fp32(tensor.exp_avg_sq, params, 0.0f, 0.01f, fill_seed_++, stream_);
      ec::MultiTensorTable table({tensor});
      if (adam) {
        executor::AdamWHyper hyper;
        return time_launches([&] { ec::adamw_step(table, hyper, nullptr, stream_); }, policy);
      }
      const std::size_t workspace = ec::grad_norm_workspace_bytes(table);
      DeviceArena scratch;
      scratch.begin(DeviceArena::rounded(workspace));
      void* ws = scratch.take(workspace);
      return time_launches([&] { ec::global_grad_norm(table, norm, ws, workspace, stream_); }, policy);
    }
    default:
      return std::nullopt;  // embedding backward, router: no standalone benchmark yet
  }
}

}  // namespace megatune::profiler::cuda
