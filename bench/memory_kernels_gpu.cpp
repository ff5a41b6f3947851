// Benchmark: the training step's memory-bound kernels (norm forward / backward, bias gradients as column
// sums, GELU / SwiGLU forward and backward, RoPE) at one step's shapes (gpt-1.3b: 8192 tokens x 2048, FFN
// 8192; llama-1b: 8192 tokens x 2048, FFN 8192, 32 / 8 heads of 64), plus RoPE over other token counts and
// head splits, and the FP8 casts of gpt-1.3b's linears (a forward input, an output gradient with its
// transpose, a transposed input for the weight gradient; delayed and current scaling), each as achieved GB/s of the bytes it must move, held against a device-to-device copy measured
// in the same run. CUDA-event timing, warm-up, median of repeats.
//   bench_memory_kernels_gpu [--repeats N]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "bench/gpu_timing.h"
#include "executor/cuda/activation_kernels.h"
#include "executor/cuda/cross_entropy_kernels.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/elementwise_kernels.h"
#include "executor/cuda/fp8_kernels.h"
#include "executor/cuda/norm_kernels.h"
#include "executor/cuda/rope_kernels.h"
#include "layouts/fp8.h"

namespace cuda = megatune::executor::cuda;
using megatune::bench::device_alloc;
using megatune::bench::median_ms;
using megatune::executor::AttentionShape;
using megatune::executor::NormKind;

namespace {

cuda::bf16* random_bf16(size_t n, unsigned seed) {
  auto* p = device_alloc<cuda::bf16>(n);
  megatune::bench::fill_random(p, n, seed);
  return p;
}

int repeats = 30;
double copy_gbs = 0.0;

void report(const char* name, double bytes, double ms) {
  const double gbs = bytes / ms / 1e6;
  std::printf("RESULT memory %-44s %8.1f us %8.1f GB/s %5.1f%% of copy\n", name, ms * 1e3, gbs,
              100.0 * gbs / copy_gbs);
}

int run() {
  const int64_t layouts_state_elements = megatune::layouts::kFp8History + 16;
  const int64_t tokens = 8192, hidden = 2048, ffn = 8192;
  const size_t th = size_t(tokens * hidden);
  // Reference: a 256 MiB device-to-device copy (reads and writes counted).
  {
    const size_t bytes = size_t(256) << 20;
    void* a = device_alloc<char>(bytes);
    void* b = device_alloc<char>(bytes);
    const double ms = median_ms(
        [&] { MEGATUNE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 3, repeats);
    copy_gbs = 2.0 * bytes / ms / 1e6;
    std::printf("RESULT memory %-44s %8.1f us %8.1f GB/s\n", "copy 256 MiB (reference)", ms * 1e3, copy_gbs);
    cudaFree(a), cudaFree(b);
  }
  cuda::bf16* x = random_bf16(th, 1);
  cuda::bf16* residual = random_bf16(th, 2);
  cuda::bf16* sum = random_bf16(th, 3);
  cuda::bf16* y = random_bf16(th, 4);
  cuda::bf16* dy = random_bf16(th, 5);
  cuda::bf16* dres = random_bf16(th, 6);
  cuda::bf16* gamma = random_bf16(size_t(hidden), 7);
  cuda::bf16* beta = random_bf16(size_t(hidden), 8);
  auto* mean = device_alloc<float>(size_t(tokens));
  auto* rstd = device_alloc<float>(size_t(tokens));
  auto* dgamma = device_alloc<float>(size_t(ffn) * 2);
  auto* dbeta = device_alloc<float>(size_t(hidden));
  const size_t ws_bytes = std::max(cuda::norm_backward_workspace_bytes(tokens, hidden),
                                   cuda::column_sum_workspace_bytes(tokens, 2 * ffn));
  void* ws = device_alloc<char>(ws_bytes);
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
    const char* label = kind == NormKind::kLayerNorm ? "LayerNorm" : "RMSNorm";
    // With the residual fused (x, residual read; sum, y written) and without (x read, y written).
    for (const bool fused : {true, false}) {
      const double ms = median_ms(
          [&] {
            cuda::norm_forward(kind, x, fused ? residual : nullptr, gamma, beta, y, fused ? sum : nullptr,
                               mean, rstd, tokens, hidden, 1e-5f, nullptr);
          },
          3, repeats);
      report((std::string(label) + (fused ? " forward +residual 8192x2048" : " forward 8192x2048")).c_str(),
             (fused ? 4.0 : 2.0) * th * 2, ms);
    }
    // The last forward above (no residual) left x's statistics in mean / rstd.
    const double apply = median_ms(
        [&] { cuda::norm_apply(kind, x, gamma, beta, mean, rstd, y, tokens, hidden, nullptr); }, 3, repeats);
    report((std::string(label) + " recompute from saved statistics 8192x2048").c_str(), 2.0 * th * 2, apply);
    for (auto variant : {cuda::NormBackwardKernel::kFused, cuda::NormBackwardKernel::kSeparate}) {
      const double bwd = median_ms(
          [&] {
            cuda::norm_backward(kind, dy, sum, gamma, mean, rstd, dres, dres, dgamma, dbeta, tokens, hidden,
                                true, ws, ws_bytes, nullptr, variant);
          },
          3, repeats);
      report((std::string(label) + " backward +d_residual 8192x2048 " +
              (variant == cuda::NormBackwardKernel::kFused ? "fused" : "separate"))
                 .c_str(),
             4.0 * th * 2, bwd);
    }
  }
  cuda::bf16* big = random_bf16(size_t(tokens) * 2 * ffn, 9);
  cuda::bf16* big2 = random_bf16(size_t(tokens) * 2 * ffn, 10);
  cuda::bf16* mid = random_bf16(size_t(tokens) * ffn, 11);
  for (int64_t cols : {hidden, 3 * hidden, ffn}) {
    const double ms = median_ms(
        [&] { cuda::column_sum_bf16(big, dgamma, tokens, cols, true, ws, ws_bytes, nullptr); }, 3, repeats);
    report(("bias gradient (column sum) 8192x" + std::to_string(cols)).c_str(), double(tokens) * cols * 2,
           ms);
  }
  const double tf = double(tokens) * ffn;
  report("GELU forward 8192x8192 (after a GEMM + bias)", 2.0 * tf * 2,
         median_ms([&] { cuda::bias_gelu_forward(big, nullptr, nullptr, mid, tokens, ffn, nullptr); }, 3,
                   repeats));
  report("GELU backward + recomputed output 8192x8192", 4.0 * tf * 2,
         median_ms(
             [&] {
               cuda::gelu_backward_recompute(mid, big, big2, big2 + size_t(tokens * ffn), tokens, ffn,
                                             nullptr);
             },
             3, repeats));
  report("GELU backward 8192x8192", 3.0 * tf * 2,
         median_ms([&] { cuda::gelu_backward(mid, big, big2, tokens, ffn, nullptr); }, 3, repeats));
  report("SwiGLU forward 8192x(2x8192)", 3.0 * tf * 2,
         median_ms([&] { cuda::swiglu_forward(big, mid, tokens, ffn, nullptr); }, 3, repeats));
  report("SwiGLU backward 8192x(2x8192)", 5.0 * tf * 2,
         median_ms([&] { cuda::swiglu_backward(mid, big, big2, tokens, ffn, nullptr); }, 3, repeats));
  report("SwiGLU backward + recomputed output 8192x(2x8192)", 6.0 * tf * 2,
         median_ms([&] { cuda::swiglu_backward_recompute(mid, big, big2, mid, tokens, ffn, nullptr); }, 3,
                   repeats));
  // RoPE in place on packed qkv (q and k rotated, v untouched): bytes read and written of the q and k heads.
  auto rope = [&](const AttentionShape& s, const std::string& name) {
    const double ms = median_ms(
        [&] { cuda::rope_forward_inplace(s, big, big + s.packed_k_offset(), 500000.0f, 0, nullptr); }, 3,
        repeats);
    report(name.c_str(), 2.0 * s.batch * s.seq_q * (s.num_heads + s.num_kv_heads) * s.head_dim * 2, ms);
  };
  rope({.batch = 2, .seq_q = 4096, .num_heads = 32, .num_kv_heads = 8, .head_dim = 64},
       "RoPE forward in place, llama-1b qkv (q and k)");
  // Other token counts and head splits (tensor parallelism divides the heads, context parallelism and short
  // sequences the tokens): the shapes the planner's profile sweeps.
  for (const auto& [seq, heads, kv_heads, head_dim] : {std::tuple{512, 32, 8, 64},
                                                       {2048, 32, 8, 64},
                                                       {512, 32, 8, 128},
                                                       {2048, 32, 8, 128},
                                                       {8192, 32, 8, 128},
                                                       {2048, 4, 1, 128},
                                                       {8192, 4, 1, 128},
                                                       {8192, 8, 2, 64}})
    rope({.batch = 1, .seq_q = seq, .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim},
         "RoPE forward in place, " + std::to_string(seq) + " tokens, " + std::to_string(heads) + " / " +
             std::to_string(kv_heads) + " heads of " + std::to_string(head_dim));
  {  // FP8 casts at gpt-1.3b's linear shapes (8192 tokens): bytes are the bf16 read(s) and the FP8 writes
    cuda::bf16* src = random_bf16(size_t(tokens * ffn), 13);
    auto* out = device_alloc<uint8_t>(size_t(tokens * ffn));
    auto* out_t = device_alloc<uint8_t>(size_t(tokens * ffn));
    auto* state = device_alloc<float>(size_t(layouts_state_elements));
    std::vector<float> initial(size_t(layouts_state_elements), 0.0f);
    initial[megatune::layouts::kFp8Scale] = initial[megatune::layouts::kFp8ScaleInv] = 1.0f;
    MEGATUNE_CUDA_CHECK(cudaMemcpy(state, initial.data(), initial.size() * 4, cudaMemcpyHostToDevice));
    for (const int64_t cols : {hidden, 3 * hidden, ffn})
      for (const bool current : {false, true})
        for (const int outputs : {1, 2, 3}) {  // 1: rows, 2: transposed, 3: both
          if (!current && outputs == 2) continue;  // the weight gradient's input cast is current-scaled
          cuda::Fp8CastLaunch launch{.src = src,
                                     .rows = tokens,
                                     .cols = cols,
                                     .ld = cols,
                                     .out = (outputs & 1) ? out : nullptr,
                                     .out_t = (outputs & 2) ? out_t : nullptr,
                                     .state = state,
                                     .e5m2 = false,
                                     .current_scaling = current,
                                     .history_len = 16,
                                     .amax_max = true};
          const double elements = double(tokens) * double(cols);
          const double bytes = elements * ((current ? 4.0 : 2.0) + (outputs == 3 ? 2.0 : 1.0));
          const std::string name = std::string("FP8 cast ") + (current ? "current " : "delayed ") +
                                   (outputs == 1 ? "rows" : outputs == 2 ? "transposed" : "rows+transposed") +
                                   " 8192x" + std::to_string(cols);
          report(name.c_str(), bytes, median_ms([&] { cuda::fp8_cast(launch, nullptr); }, 3, repeats));
        }
    cudaFree(src), cudaFree(out), cudaFree(out_t), cudaFree(state);
  }
  {  // one 512 MiB LM-head chunk of llama-1b's vocabulary: the logits read twice, the gradient written
    const int64_t rows = 2048, vocab = 128256;
    cuda::bf16* logits = random_bf16(size_t(rows * vocab), 12);
    auto* targets = device_alloc<int32_t>(size_t(rows));
    std::vector<int32_t> host_targets(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) host_targets[size_t(r)] = int32_t((r * 7919) % vocab);
    MEGATUNE_CUDA_CHECK(
        cudaMemcpy(targets, host_targets.data(), rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    auto* losses = device_alloc<float>(size_t(rows));
    report("cross entropy fwd+bwd 2048x128256 (bf16 in place)", 2.0 * rows * vocab * 2,
           median_ms(
               [&] {
                 cuda::cross_entropy_forward_backward(logits, targets, losses, rows, vocab, true, 1e-4f,
                                                      nullptr);
               },
               3, repeats));
    cudaFree(logits), cudaFree(targets), cudaFree(losses);
  }
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p :
       {(void*)x, (void*)residual, (void*)sum, (void*)y, (void*)dy, (void*)dres, (void*)gamma, (void*)beta,
        (void*)mean, (void*)rstd, (void*)dgamma, (void*)dbeta, ws, (void*)big, (void*)big2, (void*)mid})
    cudaFree(p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_memory_kernels_gpu [--repeats N]\n");
      return 2;
    }
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_kernels_gpu: %s\n", e.what());
    return 1;
  }
}
