// Benchmark: megatune's flash attention forward/backward (bf16, causal) on the shapes of
// shared/anchors/sdpa_bench.py, plus a cuBLASLt bf16 GEMM ceiling through GemmRunner. CUDA-event timing,
// warm-up, median of repeats, fresh random inputs. FLOPs: AttentionShape's (attended pairs: s(s+1)/2 causal;
// fwd 2 (d + d_v), bwd 2 (3 d + 2 d_v) per pair and head).
// --sweep: every compiled head dim (q/k, v) at b * s = 16k tokens, s 2048 and 4096, causal and not, the
// shapes of bench/peer/sdpa_head_dims.py (torch SDPA's FlashAttention-2 and cuDNN backends).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/gemm_runner.h"

using megatune::executor::AttentionShape;
namespace cuda = megatune::executor::cuda;

namespace {

double median_ms(const std::function<void()>& body) { return megatune::bench::median_ms(body, 5, 30); }
using megatune::bench::device_alloc;
using megatune::bench::fill_random;

// The head-dim sweep: one SWEEP line per shape with the default kernels' times, and the mma.sync forward
// variants' for the head dims other than 64 and 128 (the kernels those head dims ran before the wgmma ones).
void head_dim_sweep() {
  struct Dims {
    int d, dv;
  };
  for (const Dims dims :
       {Dims{64, 64}, Dims{80, 80}, Dims{96, 96}, Dims{128, 128}, Dims{192, 128}, Dims{256, 256}}) {
    for (const int s : {2048, 4096}) {
      for (const bool causal : {true, false}) {
        const int b = 16384 / s, h = dims.d <= 96 ? 32 : 16;
        AttentionShape shape{.batch = b,
                             .seq_q = s,
                             .num_heads = h,
                             .num_kv_heads = h,
                             .head_dim = dims.d,
                             .head_dim_v = dims.dv,
                             .causal = causal};
        const size_t tokens = size_t(b) * s, qkv_elems = tokens * shape.packed_token_stride();
        const size_t o_elems = tokens * h * dims.dv;
        auto* qkv = device_alloc<cuda::bf16>(qkv_elems);
        auto* dqkv = device_alloc<cuda::bf16>(qkv_elems);
        auto* o = device_alloc<cuda::bf16>(o_elems);
        auto* d_o = device_alloc<cuda::bf16>(o_elems);
        auto* lse = device_alloc<float>(size_t(b) * h * s);
        const size_t ws_bytes = cuda::flash_attention_backward_workspace_bytes(shape);
        auto* ws = device_alloc<unsigned char>(ws_bytes);
        fill_random(qkv, qkv_elems, 1);
        fill_random(d_o, o_elems, 2);
        const cuda::bf16 *q = qkv, *k = qkv + shape.packed_k_offset(), *v = qkv + shape.packed_v_offset();
        const double fwd = median_ms([&] { cuda::flash_attention_forward(shape, q, k, v, o, lse, nullptr); });
        const bool mma = dims.d != dims.dv || (dims.d != 64 && dims.d != 128);
        auto rows = [&](int rows_per_warp) {
          return median_ms(
              [&] { cuda::flash_attention_forward_variant(shape, q, k, v, o, lse, nullptr, rows_per_warp); });
        };
        const double fwd16 = mma ? rows(16) : 0.0, fwd32 = mma ? rows(32) : 0.0;
        cuda::flash_attention_forward(shape, q, k, v, o, lse, nullptr);
        const double bwd = median_ms([&] {
          cuda::flash_attention_backward(shape, q, k, v, o, lse, d_o, dqkv, dqkv + shape.packed_k_offset(),
                                         dqkv + shape.packed_v_offset(), ws, ws_bytes, nullptr);
        });
        std::printf(
            "SWEEP d=%d dv=%d B=%d H=%d T=%d causal=%d fwd_ms=%.3f bwd_ms=%.3f fwd_tflops=%.1f "
            "bwd_tflops=%.1f "
            "fwd_rows16_ms=%.3f fwd_rows32_ms=%.3f\n",
            dims.d, dims.dv, b, h, s, int(causal), fwd, bwd, shape.forward_flops() / fwd / 1e9,
            shape.backward_flops() / bwd / 1e9, fwd16, fwd32);
        std::fflush(stdout);
        cudaFree(qkv), cudaFree(dqkv), cudaFree(o), cudaFree(d_o), cudaFree(lse), cudaFree(ws);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --once: one forward and one backward launch of B=2 H=16 T=4096 D=128 (for ncu), then exit.
  // --once [D]: one forward and one backward launch of T=4096 with head dim D (128: B=2 H=16; 64: B=2 H=32
  // KV=8, the llama-1b shape), for ncu; then exit.
  const bool once = argc > 1 && std::string(argv[1]) == "--once";
  const int once_head_dim = argc > 2 ? std::atoi(argv[2]) : 128;
  cudaDeviceProp prop{};
  MEGATUNE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device %s, driver API %d, runtime %d\n", prop.name, driver, runtime);
  if (argc > 1 && std::string(argv[1]) == "--sweep") {
    head_dim_sweep();
    return 0;
  }

  struct Config {
    int b, h, s, d, kv;
  };
  const Config configs[] = {{4, 16, 2048, 128, 16},
                            {2, 32, 4096, 64, 32},
                            {1, 16, 8192, 128, 16},
                            {2, 16, 4096, 128, 16},
                            {2, 32, 4096, 64, 8}};
  std::printf("%-28s %10s %10s %10s %12s %12s %14s\n", "shape (causal)", "fwd ms", "bwd ms", "fwd TF/s",
              "bwd TF/s", "fwd+bwd TF/s", "");
  for (const Config& c : configs) {
    AttentionShape shape{
        .batch = c.b, .seq_q = c.s, .num_heads = c.h, .num_kv_heads = c.kv, .head_dim = c.d, .causal = true};
    const size_t tokens = size_t(c.b) * c.s;
    const size_t qkv_elems = tokens * shape.packed_token_stride(), o_elems = tokens * c.h * c.d;
    auto* qkv = device_alloc<cuda::bf16>(qkv_elems);
    auto* dqkv = device_alloc<cuda::bf16>(qkv_elems);
    auto* o = device_alloc<cuda::bf16>(o_elems);
    auto* d_o = device_alloc<cuda::bf16>(o_elems);
    auto* lse = device_alloc<float>(size_t(c.b) * c.h * c.s);
    const size_t ws_bytes = cuda::flash_attention_backward_workspace_bytes(shape);
    auto* ws = device_alloc<unsigned char>(ws_bytes);
    fill_random(qkv, qkv_elems, 1);
    fill_random(d_o, o_elems, 2);
    const cuda::bf16* q = qkv;
    const cuda::bf16* k = qkv + shape.packed_k_offset();
    const cuda::bf16* v = qkv + shape.packed_v_offset();
    if (once) {
      if (c.s != 4096 || c.d != once_head_dim || (c.d == 64 && c.kv != 8)) continue;
      cuda::flash_attention_forward(shape, q, k, v, o, lse, nullptr);
      cuda::flash_attention_backward(shape, q, k, v, o, lse, d_o, dqkv, dqkv + shape.packed_k_offset(),
                                     dqkv + shape.packed_v_offset(), ws, ws_bytes, nullptr);
      MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
      return 0;
    }
    auto forward_variant = [&](int rows_per_warp, int warpgroups, bool warp_specialized = false,
                               bool ping_pong = false) {
      return median_ms([&] {
        cuda::flash_attention_forward_variant(shape, q, k, v, o, lse, nullptr, rows_per_warp, warpgroups,
                                              warp_specialized, ping_pong);
      });
    };
    const double fwd16 = forward_variant(16, 0), fwd32 = forward_variant(32, 0);
    const double fwd = median_ms([&] { cuda::flash_attention_forward(shape, q, k, v, o, lse, nullptr); });
    const double fwd_wg1 = forward_variant(64, 1), fwd_wg2 = forward_variant(64, 2);
    const double fwd_ws2 = forward_variant(64, 2, true),
                 fwd_ws3 = c.d == 64 ? forward_variant(64, 3, true) : 0.0;
    const double fwd_ws2_pp = forward_variant(64, 2, true, true),
                 fwd_ws3_pp = c.d == 64 ? forward_variant(64, 3, true, true) : 0.0;
    auto backward_variant = [&](cuda::BackwardVariant variant) {
      return median_ms([&] {
        cuda::flash_attention_backward_variant(shape, q, k, v, o, lse, d_o, dqkv,
                                               dqkv + shape.packed_k_offset(), dqkv + shape.packed_v_offset(),
                                               ws, ws_bytes, nullptr, variant);
      });
    };
    const double bwd64 = backward_variant({64, false, false}),
                 bwd64_longest = backward_variant({64, true, false});
    const double bwd128 = backward_variant({128, false, false}),
                 bwd128_longest = backward_variant({128, true, false});
    const double bwd_wg1 = backward_variant({64, true, true, 1, cuda::WgmmaDq::kAtomics, false}),
                 bwd_wg2 = backward_variant({64, true, true, 2, cuda::WgmmaDq::kAtomics, false}),
                 bwd_bulk = backward_variant({64, true, true, 2, cuda::WgmmaDq::kBulkTiles, false}),
                 bwd_ws = backward_variant({64, true, true, 0, cuda::WgmmaDq::kAtomics, true}),
                 bwd_ws3 = backward_variant({64, true, true, 0, cuda::WgmmaDq::kAtomics, true, 3}),
                 bwd_ws_bulk = backward_variant({64, true, true, 0, cuda::WgmmaDq::kBulkTiles, true});
    const double bwd = median_ms([&] {
      cuda::flash_attention_backward(shape, q, k, v, o, lse, d_o, dqkv, dqkv + shape.packed_k_offset(),
                                     dqkv + shape.packed_v_offset(), ws, ws_bytes, nullptr);
    });
    const double flops = shape.forward_flops();
    char name[64];
    std::snprintf(name, sizeof name, "B=%d H=%d KV=%d T=%d D=%d", c.b, c.h, c.kv, c.s, c.d);
    std::printf("%-28s %10.3f %10.3f %10.1f %12.1f %12.1f\n", name, fwd, bwd, flops / fwd / 1e9,
                2.5 * flops / bwd / 1e9, 3.5 * flops / (fwd + bwd) / 1e9);
    std::printf(
        "VARIANT forward %s mma.sync rows_per_warp16=%.1f rows_per_warp32=%.1f wgmma 1 warpgroup/block=%.1f "
        "2 warpgroups/block=%.1f warp-specialized 2 consumers=%.1f 3 consumers=%.1f ping-pong 2=%.1f 3=%.1f "
        "(default)=%.1f TFLOP/s\n",
        name, shape.forward_flops() / fwd16 / 1e9, shape.forward_flops() / fwd32 / 1e9,
        shape.forward_flops() / fwd_wg1 / 1e9, shape.forward_flops() / fwd_wg2 / 1e9,
        shape.forward_flops() / fwd_ws2 / 1e9, fwd_ws3 > 0 ? shape.forward_flops() / fwd_ws3 / 1e9 : 0.0,
        shape.forward_flops() / fwd_ws2_pp / 1e9,
        fwd_ws3_pp > 0 ? shape.forward_flops() / fwd_ws3_pp / 1e9 : 0.0, shape.forward_flops() / fwd / 1e9);
    std::printf(
        "VARIANT backward %s mma.sync key_rows64=%.1f key_rows64_longest_first=%.1f key_rows128=%.1f "
        "key_rows128_longest_first=%.1f wgmma 1 warpgroup/block=%.1f 2 warpgroups/block=%.1f 2 bulk dQ "
        "tiles=%.1f warp-specialized=%.1f ws 3 stages=%.1f ws bulk dQ=%.1f (default)=%.1f TFLOP/s\n",
        name, 2.5 * flops / bwd64 / 1e9, 2.5 * flops / bwd64_longest / 1e9, 2.5 * flops / bwd128 / 1e9,
        2.5 * flops / bwd128_longest / 1e9, 2.5 * flops / bwd_wg1 / 1e9, 2.5 * flops / bwd_wg2 / 1e9,
        2.5 * flops / bwd_bulk / 1e9, 2.5 * flops / bwd_ws / 1e9, 2.5 * flops / bwd_ws3 / 1e9,
        2.5 * flops / bwd_ws_bulk / 1e9, 2.5 * flops / bwd / 1e9);
    std::printf("RESULT attention %s fwd_tflops=%.1f bwd_tflops=%.1f fwdbwd_tflops=%.1f\n", name,
                flops / fwd / 1e9, 2.5 * flops / bwd / 1e9, 3.5 * flops / (fwd + bwd) / 1e9);
    cudaFree(qkv), cudaFree(dqkv), cudaFree(o), cudaFree(d_o), cudaFree(lse), cudaFree(ws);
  }

  // GEMM ceiling through the executor's cuBLASLt path.
  {
    const int64_t n = 8192;
    auto* a = device_alloc<cuda::bf16>(size_t(n * n));
    auto* b = device_alloc<cuda::bf16>(size_t(n * n));
    auto* c = device_alloc<cuda::bf16>(size_t(n * n));
    fill_random(a, size_t(n * n), 3);
    fill_random(b, size_t(n * n), 4);
    cuda::GemmRunner runner;
    const double ms = median_ms([&] { cuda::linear_forward(runner, a, b, nullptr, c, n, n, n, nullptr); });
    std::printf("RESULT gemm linear_forward 8192^3 bf16: %.3f ms, %.1f TFLOP/s\n", ms,
                2.0 * n * n * n / ms / 1e9);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  return 0;
}
