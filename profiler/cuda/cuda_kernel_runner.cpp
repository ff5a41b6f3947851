// CudaKernelRunner: the timing loop and the GEMM benchmarks through the executor's GemmRunner.
#include "profiler/cuda/cuda_kernel_runner.h"

#include <algorithm>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/fp8_kernels.h"
#include "layouts/fp8.h"
#include "profiler/cuda/device_fill.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler::cuda {

namespace ec = executor::cuda;

CudaKernelRunner::CudaKernelRunner(Tracer& tracer, cudaStream_t stream, std::uint64_t first_range_id)
    : tracer_(tracer), stream_(stream), next_range_id_(first_range_id) {}

std::vector<double> CudaKernelRunner::time_launches(const std::function<void()>& launch,
                                                    const RepeatPolicy& policy) {
  for (int i = 0; i < policy.warmup; ++i) launch();
  tracer_.flush();  // drop the warm-up records
  std::vector<std::uint64_t> ids;
  ids.reserve(policy.repeats);
  for (int r = 0; r < policy.repeats; ++r) {
    const std::uint64_t id = next_range_id_++;
    ids.push_back(id);
    TraceRange range(tracer_, id);
    launch();
  }
  return range_busy_seconds(tracer_.flush(), ids);
}

namespace {

ec::GemmSpec spec_of(const GemmItem& item) {
  ec::GemmSpec spec;
  spec.m = item.m, spec.n = item.n, spec.k = item.k;
  switch (item.variant) {
    case GemmVariant::kForward:
      spec.trans_b = true;  // y = x . w^T, w stored [n, k]
      break;
    case GemmVariant::kBackwardData:
      break;  // dx = dy . w, w stored [k, n] as (out, in) with out = k
    case GemmVariant::kBackwardWeight:
      spec.trans_a = true;  // dw = dy^T . x, dy stored [k, m]
      spec.d_type = ec::GemmDType::kFP32;
      break;
  }
  switch (item.fusion) {
    case GemmFusion::kNone:
      break;
    case GemmFusion::kBias:
      spec.epilogue = ec::GemmEpilogue::kBias;
      break;
    case GemmFusion::kGeluAux:
      spec.epilogue = ec::GemmEpilogue::kGeluAux;
      break;
    case GemmFusion::kGeluAuxBias:
      spec.epilogue = ec::GemmEpilogue::kGeluAuxBias;
      break;
    case GemmFusion::kDGeluBiasGrad:
      spec.epilogue = ec::GemmEpilogue::kDGeluBGrad;
      break;
  }
  return spec;
}

// An FP8 linear's GEMM as the executor issues it (executor/parallel/tensor_parallel.cpp): every variant "TN"
// (Hopper's FP8 tensor cores take both operands with the reduction dimension contiguous: the weight's and
// the gradient's transposed copies serve the backward), E4M3 operands (hybrid's E5M2 gradients run the same
// kernels), cuBLASLt's fast accumulation, a device scale per operand; the forward keeps its fused bias or
// GELU, the backward GEMMs run unfused (the bias gradient comes from the gradient's cast).
ec::GemmSpec fp8_spec_of(const GemmItem& item) {
  ec::GemmSpec spec = spec_of(item);
  spec.trans_a = false;
  spec.trans_b = true;
  spec.ab_type = spec.b_type = ec::GemmDType::kFP8E4M3;
  spec.fast_accumulate = true;
  if (item.variant != GemmVariant::kForward) spec.epilogue = ec::GemmEpilogue::kNone;
  return spec;
}

}  // namespace

void CudaKernelRunner::cast_random_fp8(void* bf16_source, void* fp8, float* state, std::int64_t rows,
                                       std::int64_t cols) {
  fill_uniform_bf16(bf16_source, rows * cols, -1.0f, 1.0f, fill_seed_++, stream_);
  ec::Fp8CastLaunch cast;
  cast.src = static_cast<const ec::bf16*>(bf16_source);
  cast.rows = rows, cast.cols = cols, cast.ld = cols;
  cast.out = static_cast<std::uint8_t*>(fp8);
  cast.state = state;
  cast.current_scaling = true;
  ec::fp8_cast(cast, stream_);
}

ec::GemmArgs CudaKernelRunner::gemm_buffers(const GemmItem& item, const ec::GemmSpec& spec,
                                            std::size_t element_bytes, std::size_t extra_bytes,
                                            void** extra) {
  const std::int64_t d_bytes = spec.d_type == ec::GemmDType::kFP32 ? 4 : 2;
  const std::size_t a_bytes = std::size_t(item.m * item.k) * element_bytes;
  const std::size_t b_bytes = std::size_t(item.k * item.n) * element_bytes;
  const std::size_t out_bytes = std::size_t(item.m * item.n * d_bytes);
  const std::size_t aux_bytes = std::size_t(item.m * item.n * 2);
  const std::size_t vector_bytes = std::size_t(std::max(item.m, item.n) * 4);
  arena_.begin(DeviceArena::rounded(a_bytes) + DeviceArena::rounded(b_bytes) +
               DeviceArena::rounded(out_bytes) + DeviceArena::rounded(aux_bytes) +
               2 * DeviceArena::rounded(vector_bytes) + DeviceArena::rounded(extra_bytes));
  ec::GemmArgs args;
  args.a = arena_.take(a_bytes);
  args.b = arena_.take(b_bytes);
  args.d = arena_.take(out_bytes);
  args.aux = arena_.take(aux_bytes);
  void* bias = arena_.take(vector_bytes);
  args.bias = bias;
  args.bias_grad = arena_.take(vector_bytes);
  if (extra != nullptr) *extra = arena_.take(extra_bytes);
  fill_uniform_bf16(args.aux, item.m * item.n, -2.0f, 2.0f, fill_seed_++, stream_);
  fill_uniform_bf16(bias, std::max(item.m, item.n), -0.1f, 0.1f, fill_seed_++, stream_);
  if (d_bytes == 4)
    fill_uniform_fp32(static_cast<float*>(args.d), item.m * item.n, -0.01f, 0.01f, fill_seed_++, stream_);
  args.beta = item.variant == GemmVariant::kBackwardWeight ? 1.0f : 0.0f;  // main-grad accumulation
  return args;
}

TimingSamples CudaKernelRunner::time_fp8_gemm(const GemmItem& item, const RepeatPolicy& policy) {
  ec::GemmSpec spec = fp8_spec_of(item);
  const std::int64_t state_elements = 64;  // one padded scaling state per operand (layouts/fp8.h)
  const std::size_t state_bytes = std::size_t(2 * state_elements * 4);
  // Beside the operands: the two states, then the bf16 values cast into A, then into B.
  const std::size_t source_bytes = 2 * std::size_t(std::max(item.m, item.n) * item.k);
  void* extra = nullptr;
  ec::GemmArgs args = gemm_buffers(item, spec, 1, DeviceArena::rounded(state_bytes) + source_bytes, &extra);
  auto* states = static_cast<float*>(extra);
  void* source = static_cast<char*>(extra) + DeviceArena::rounded(state_bytes);
  MEGATUNE_CUDA_CHECK(cudaMemsetAsync(states, 0, state_bytes, stream_));
  cast_random_fp8(source, const_cast<void*>(args.a), states, item.m, item.k);
  cast_random_fp8(source, const_cast<void*>(args.b), states + state_elements, item.n, item.k);
  args.bias_grad = nullptr;
  args.a_scale = states + layouts::kFp8ScaleInv;
  args.b_scale = states + state_elements + layouts::kFp8ScaleInv;
  if (!gemm_.supports(spec, args)) spec.epilogue = ec::GemmEpilogue::kNone;  // the unfused path
  return time_launches([&] { gemm_.run(spec, args, stream_); }, policy);
}

TimingSamples CudaKernelRunner::time_gemm(const GemmItem& item, const RepeatPolicy& policy) {
  if (item.dtype == layouts::DType::kFP8) return time_fp8_gemm(item, policy);
  if (item.dtype != layouts::DType::kBF16) return std::nullopt;  // the executor's GEMMs are bf16 or FP8
  ec::GemmSpec spec = spec_of(item);
  const ec::GemmArgs args = gemm_buffers(item, spec, 2, 0, nullptr);
  fill_uniform_bf16(const_cast<void*>(args.a), item.m * item.k, -1.0f, 1.0f, fill_seed_++, stream_);
  fill_uniform_bf16(const_cast<void*>(args.b), item.k * item.n, -1.0f, 1.0f, fill_seed_++, stream_);
  try {
    gemm_.prepare(spec);
  } catch (const std::runtime_error&) {
    if (spec.epilogue == ec::GemmEpilogue::kNone) throw;
    spec.epilogue = ec::GemmEpilogue::kNone;  // the executor's unfused path
  }
  return time_launches([&] { gemm_.run(spec, args, stream_); }, policy);
}

}  // namespace megatune::profiler::cuda
