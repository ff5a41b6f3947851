// CudaKernelRunner: the timing loop and the GEMM benchmarks through the executor's GemmRunner.
#include "profiler/cuda/cuda_kernel_runner.h"

#include <stdexcept>

#include "executor/cuda/cuda_check.h"
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

}  // namespace

TimingSamples CudaKernelRunner::time_gemm(const GemmItem& item, const RepeatPolicy& policy) {
  if (item.dtype != layouts::DType::kBF16) return std::nullopt;  // the executor's GEMMs are bf16
  ec::GemmSpec spec = spec_of(item);
  const std::int64_t d_bytes = spec.d_type == ec::GemmDType::kFP32 ? 4 : 2;
  const std::size_t a_bytes = std::size_t(item.m * item.k * 2), b_bytes = std::size_t(item.k * item.n * 2);
  const std::size_t out_bytes = std::size_t(item.m * item.n * d_bytes);
  const std::size_t aux_bytes = std::size_t(item.m * item.n * 2);
  const std::size_t vector_bytes = std::size_t(std::max(item.m, item.n) * 4);
  arena_.begin(DeviceArena::rounded(a_bytes) + DeviceArena::rounded(b_bytes) +
               DeviceArena::rounded(out_bytes) + DeviceArena::rounded(aux_bytes) +
               2 * DeviceArena::rounded(vector_bytes));
  ec::GemmArgs args;
  void* a = arena_.take(a_bytes);
  void* b = arena_.take(b_bytes);
  void* d = arena_.take(out_bytes);
  void* aux = arena_.take(aux_bytes);
  void* bias = arena_.take(vector_bytes);
  void* bias_grad = arena_.take(vector_bytes);
  fill_uniform_bf16(a, item.m * item.k, -1.0f, 1.0f, fill_seed_++, stream_);
  fill_uniform_bf16(b, item.k * item.n, -1.0f, 1.0f, fill_seed_++, stream_);
  fill_uniform_bf16(aux, item.m * item.n, -2.0f, 2.0f, fill_seed_++, stream_);
  fill_uniform_bf16(bias, std::max(item.m, item.n), -0.1f, 0.1f, fill_seed_++, stream_);
  if (d_bytes == 4) {
    fill_uniform_fp32(static_cast<float*>(d), item.m * item.n, -0.01f, 0.01f, fill_seed_++, stream_);
  }
  args.a = a, args.b = b, args.d = d;
  args.beta = item.variant == GemmVariant::kBackwardWeight ? 1.0f : 0.0f;  // main-grad accumulation
  args.bias = bias, args.aux = aux, args.bias_grad = bias_grad;
  try {
    gemm_.prepare(spec);
  } catch (const std::runtime_error&) {
    if (spec.epilogue == ec::GemmEpilogue::kNone) throw;
    spec.epilogue = ec::GemmEpilogue::kNone;  // the executor's unfused path
  }
  return time_launches([&] { gemm_.run(spec, args, stream_); }, policy);
}

}  // namespace megatune::profiler::cuda
