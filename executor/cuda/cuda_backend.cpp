// CudaBackend: device arena, streams/events, and the dispatch of every Backend kernel to executor/cuda.
#include "executor/cuda/cuda_backend.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "executor/cuda/activation_kernels.h"
#include "executor/cuda/attention_merge_kernels.h"
#include "executor/cuda/cross_entropy_kernels.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/elementwise_kernels.h"
#include "executor/cuda/embedding_kernels.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/fp8_kernels.h"
#include "executor/cuda/gemm_runner.h"
#include "executor/cuda/moe_index_cache.h"
#include "executor/cuda/norm_kernels.h"
#include "executor/cuda/optimizer_kernels.h"
#include "executor/cuda/rope_kernels.h"

namespace megatune::executor {
namespace {

using cuda::bf16;

bf16* b16(Tensor t) { return static_cast<bf16*>(t.data); }
float* f32(Tensor t) { return static_cast<float*>(t.data); }

void require_bf16(const Tensor& t, const char* what) {
  if (t.dtype != DType::kBF16 || t.is_int32)
    throw std::logic_error(std::string("cuda backend: ") + what + " must be bf16 (train with --bf16)");
}
void require_fp32(const Tensor& t, const char* what) {
  if (t.dtype != DType::kFP32 || t.is_int32)
    throw std::logic_error(std::string("cuda backend: ") + what + " must be fp32");
}
void require_contiguous(const Tensor& t, const char* what) {
  if (!t.contiguous()) throw std::logic_error(std::string("cuda backend: ") + what + " must be contiguous");
}

cuda::GemmDType gemm_dtype(const Tensor& t) {
  return t.dtype == DType::kFP32 ? cuda::GemmDType::kFP32 : cuda::GemmDType::kBF16;
}

}  // namespace

int CudaBackend::device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

CudaBackend::CudaBackend(int device) : device_(device) {
  MEGATUNE_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  MEGATUNE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  events_.resize(kEventPoolSize);
  for (cudaEvent_t& e : events_) MEGATUNE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  gemm_ = std::make_unique<cuda::GemmRunner>();
  moe_indices_ = std::make_unique<cuda::MoeIndexCache>();
  MEGATUNE_CUDA_CHECK(cudaMalloc(&grad_norm_device_, sizeof(float)));
}

CudaBackend::~CudaBackend() {
  // Destructors must not throw: release what we hold and ignore errors of a broken context.
  cudaStreamSynchronize(compute_);
  for (cudaStream_t s : communication_)
    if (s != nullptr) cudaStreamSynchronize(s);
  optimizer_table_.reset();
  grad_norm_table_.reset();
  gemm_.reset();
  moe_indices_.reset();
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (auto& [start, stop] : timing_events_) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  cudaFree(grad_norm_workspace_);
  cudaFree(grad_norm_device_);
  if (pinned_staging_done_ != nullptr) cudaEventDestroy(pinned_staging_done_);
  cudaFreeHost(pinned_staging_);
  cudaFree(arena_);
  for (void* block : blocks_) cudaFree(block);
  cudaStreamDestroy(compute_);
  for (cudaStream_t s : communication_)
    if (s != nullptr) cudaStreamDestroy(s);
}

std::string CudaBackend::name() const {
  return "cuda:" + std::to_string(device_) + " (" + device_name_ + ")";
}

CudaBackend::MemoryInfo CudaBackend::memory_info(int device) {
  MEGATUNE_CUDA_CHECK(cudaSetDevice(device));
  std::size_t free_bytes = 0, total_bytes = 0;
  MEGATUNE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<std::int64_t>(free_bytes), static_cast<std::int64_t>(total_bytes)};
}

std::int64_t CudaBackend::storage_bytes(DType dtype) const { return layouts::dtype_bytes(dtype); }

std::int64_t CudaBackend::device_bytes() const {
  return arena_capacity_bytes() + block_bytes() + static_cast<std::int64_t>(gemm_->workspace_bytes()) +
         static_cast<std::int64_t>(grad_norm_workspace_bytes_);
}

void* CudaBackend::reserve_memory(std::int64_t bytes) {
  MEGATUNE_CUDA_CHECK(cudaMalloc(&arena_, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 256))));
  return arena_;
}

void* CudaBackend::reserve_block(std::int64_t bytes) {
  void* block = nullptr;
  MEGATUNE_CUDA_CHECK(cudaMalloc(&block, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 256))));
  blocks_.push_back(block);
  return block;
}

void CudaBackend::free_block(void* block) {
  const auto held = std::find(blocks_.begin(), blocks_.end(), block);
  if (held == blocks_.end()) throw std::logic_error("CudaBackend::free_block: not a block of this backend");
  blocks_.erase(held);
  MEGATUNE_CUDA_CHECK(cudaFree(block));
}

// Small contiguous host <-> device copies (the per-step ones: MoE router logits and their gradients, losses)
// go through one pinned staging buffer as one 1D copy: a pitched copy to or from pageable memory runs row by
// row, and the MoE router's logits (T rows of E bf16 values) took ~2.8 ms per layer that way on an H200.
// Larger or strided tensors (weights at setup, checkpoints) keep the pitched copy from pageable memory.
void* CudaBackend::small_transfer_staging(const Tensor& t) {
  const std::size_t bytes = static_cast<std::size_t>(t.numel() * storage_bytes(t.dtype));
  if (!t.contiguous() || bytes > kPinnedStagingBytes) return nullptr;
  if (pinned_staging_ == nullptr) {
    MEGATUNE_CUDA_CHECK(cudaMallocHost(&pinned_staging_, kPinnedStagingBytes));
    MEGATUNE_CUDA_CHECK(cudaEventCreateWithFlags(&pinned_staging_done_, cudaEventDisableTiming));
    MEGATUNE_CUDA_CHECK(cudaEventRecord(pinned_staging_done_, compute_));
  }
  MEGATUNE_CUDA_CHECK(cudaEventSynchronize(pinned_staging_done_));  // the previous upload's copy has run
  return pinned_staging_;
}

void CudaBackend::do_upload(Tensor dst, const float* host, Stream on) {
  cudaStream_t stream = cuda_stream(on);
  const std::int64_t e = storage_bytes(dst.dtype), n = dst.numel();
  if (dst.dtype != DType::kBF16) require_fp32(dst, "upload target");
  if (void* pinned = small_transfer_staging(dst)) {
    if (dst.dtype == DType::kBF16) {
      auto* staged = static_cast<bf16*>(pinned);
      for (std::int64_t i = 0; i < n; ++i) staged[i] = __float2bfloat16(host[i]);
    } else {
      std::copy(host, host + n, static_cast<float*>(pinned));
    }
    MEGATUNE_CUDA_CHECK(cudaMemcpyAsync(dst.data, pinned, n * e, cudaMemcpyHostToDevice, stream));
    MEGATUNE_CUDA_CHECK(cudaEventRecord(pinned_staging_done_, stream));
  } else if (dst.dtype == DType::kBF16) {
    std::vector<bf16> staged(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) staged[i] = __float2bfloat16(host[i]);
    MEGATUNE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.row_stride * e, staged.data(), dst.cols * e,
                                          dst.cols * e, dst.rows, cudaMemcpyHostToDevice, stream));
    MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `staged` goes
  } else {
    MEGATUNE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.row_stride * e, host, dst.cols * e, dst.cols * e,
                                          dst.rows, cudaMemcpyHostToDevice, stream));
  }
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaBackend::do_download(Tensor src, float* host, Stream on) {
  cudaStream_t stream = cuda_stream(on);
  const std::int64_t e = storage_bytes(src.dtype), n = src.numel();
  if (src.dtype != DType::kBF16) require_fp32(src, "download source");
  if (void* pinned = small_transfer_staging(src)) {
    MEGATUNE_CUDA_CHECK(cudaMemcpyAsync(pinned, src.data, n * e, cudaMemcpyDeviceToHost, stream));
    MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (src.dtype == DType::kBF16) {
      const auto* staged = static_cast<const bf16*>(pinned);
      for (std::int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(staged[i]);
    } else {
      const auto* staged = static_cast<const float*>(pinned);
      std::copy(staged, staged + n, host);
    }
    return;
  }
  if (src.dtype == DType::kBF16) {
    std::vector<bf16> staged(static_cast<std::size_t>(n));
    MEGATUNE_CUDA_CHECK(cudaMemcpy2DAsync(staged.data(), src.cols * e, src.data, src.row_stride * e,
                                          src.cols * e, src.rows, cudaMemcpyDeviceToHost, stream));
    MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (std::int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(staged[i]);
    return;
  }
  MEGATUNE_CUDA_CHECK(cudaMemcpy2DAsync(host, src.cols * e, src.data, src.row_stride * e, src.cols * e,
                                        src.rows, cudaMemcpyDeviceToHost, stream));
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaBackend::upload_int32(Tensor dst, const std::int32_t* host) {
  require_contiguous(dst, "token tensor");
  // Pageable source: the copy is staged by the driver before the call returns, so `host` may be reused.
  MEGATUNE_CUDA_CHECK(
      cudaMemcpyAsync(dst.data, host, sizeof(std::int32_t) * dst.numel(), cudaMemcpyHostToDevice, compute_));
}

void CudaBackend::fill_zero(Tensor t) {
  const std::int64_t e = t.is_int32 ? 4 : storage_bytes(t.dtype);
  MEGATUNE_CUDA_CHECK(cudaMemset2DAsync(t.data, t.row_stride * e, 0, t.cols * e, t.rows, compute_));
}

void CudaBackend::copy(Tensor src, Tensor dst) {
  if (src.rows != dst.rows || src.cols != dst.cols)
    throw std::logic_error("cuda backend: copy shape mismatch");
  if (src.dtype == dst.dtype) {
    const std::int64_t e = storage_bytes(src.dtype);
    MEGATUNE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.row_stride * e, src.data, src.row_stride * e,
                                          src.cols * e, src.rows, cudaMemcpyDeviceToDevice, compute_));
    return;
  }
  require_contiguous(src, "cast source");
  require_contiguous(dst, "cast target");
  if (src.dtype == DType::kFP32 && dst.dtype == DType::kBF16) {
    cuda::cast_fp32_to_bf16(f32(src), b16(dst), src.numel(), compute_);
  } else if (src.dtype == DType::kBF16 && dst.dtype == DType::kFP32) {
    cuda::cast_bf16_to_fp32(b16(src), f32(dst), src.numel(), compute_);
  } else {
    throw std::logic_error("cuda backend: unsupported cast");
  }
}

cudaStream_t CudaBackend::cuda_stream(Stream stream) {
  if (stream.is_compute()) return compute_;
  cudaStream_t& s = communication_.at(static_cast<std::size_t>(stream.group));
  if (s == nullptr) {
    MEGATUNE_CUDA_CHECK(cudaSetDevice(device_));
    MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return s;
}

std::vector<cudaStream_t> CudaBackend::communication_streams() const {
  std::vector<cudaStream_t> streams;
  for (cudaStream_t s : communication_)
    if (s != nullptr) streams.push_back(s);
  return streams;
}

Backend::Event CudaBackend::record_event(Stream stream) {
  const int id = next_event_;
  next_event_ = (next_event_ + 1) % kEventPoolSize;
  MEGATUNE_CUDA_CHECK(cudaEventRecord(events_[id], cuda_stream(stream)));
  return id;
}

void CudaBackend::wait_event(Stream waiting, Event event) {
  MEGATUNE_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(waiting), events_.at(event), 0));
}

void CudaBackend::synchronize() {
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(compute_));
  for (cudaStream_t s : communication_streams()) MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(s));
}

std::string CudaBackend::norm_width_unsupported(std::int64_t width) {
  if (cuda::norm_supports(width)) return {};
  return "its norm kernels take widths that are multiples of 8, up to 32768";
}

std::int64_t CudaBackend::scratch_bytes(const ScratchNeeds& n) const {
  std::size_t bytes = cuda::column_sum_workspace_bytes(n.tokens, n.max_bias_cols);
  bytes = std::max(bytes, cuda::norm_backward_workspace_bytes(n.tokens, n.hidden));
  if (n.head_norm_rows > 0)
    bytes = std::max(bytes, cuda::norm_backward_workspace_bytes(n.head_norm_rows, n.head_norm_width));
  bytes = std::max(bytes, cuda::embedding_backward_workspace_bytes(n.tokens, n.vocab));
  bytes = std::max(bytes, cuda::flash_attention_backward_workspace_bytes(attention_shape(n.attention)));
  // Fused bias gradients (BGRADB): one fp32 vector of the widest bias.
  bytes = std::max(bytes, static_cast<std::size_t>(4 * n.max_bias_cols));
  return static_cast<std::int64_t>(bytes);
}

namespace {

// The cuBLASLt description of a Backend GEMM (row-major, strides from the tensors), without epilogue.
cuda::GemmDType fp8_dtype(layouts::Fp8Encoding e) {
  return e == layouts::Fp8Encoding::kE5M2 ? cuda::GemmDType::kFP8E5M2 : cuda::GemmDType::kFP8E4M3;
}

cuda::GemmSpec gemm_spec(const GemmArgs& g) {
  if (!g.is_fp8()) {
    require_bf16(g.a, "GEMM A");
    require_bf16(g.b, "GEMM B");
  }
  cuda::GemmSpec spec;
  spec.m = g.m;
  spec.n = g.n;
  spec.k = g.k;
  spec.trans_a = g.transpose_a;
  spec.trans_b = g.transpose_b;
  spec.lda = g.a.row_stride;
  spec.ldb = g.b.row_stride;
  spec.ldd = g.c.row_stride;
  spec.ab_type = g.is_fp8() ? fp8_dtype(g.a_encoding) : cuda::GemmDType::kBF16;
  spec.b_type = g.is_fp8() ? fp8_dtype(g.b_encoding) : cuda::GemmDType::kBF16;
  spec.fast_accumulate = g.is_fp8() && g.fast_accumulate;
  spec.d_type = gemm_dtype(g.c);
  spec.epilogue = g.bias.empty() ? cuda::GemmEpilogue::kNone : cuda::GemmEpilogue::kBias;
  return spec;
}

cuda::GemmArgs gemm_pointers(const GemmArgs& g) {
  cuda::GemmArgs args;
  args.a = g.a.data;
  args.b = g.b.data;
  args.d = g.c.data;
  args.alpha = 1.0f;
  args.beta = g.accumulate ? 1.0f : 0.0f;
  args.bias = g.bias.empty() ? nullptr : g.bias.data;
  if (g.is_fp8()) {
    args.a_scale = f32(g.a_scale_inv);
    args.b_scale = f32(g.b_scale_inv);
  }
  return args;
}

}  // namespace

void CudaBackend::do_gemm(const GemmArgs& g) {
  cuda::GemmSpec spec = gemm_spec(g);
  cuda::GemmArgs args = gemm_pointers(g);
  if (g.bias_grad.empty()) {
    gemm_->run(spec, args, compute_);
    return;
  }
  // Weight gradient with the layer's bias gradient: cuBLASLt's BGRADB (our A = dY^T is cuBLAS's B) writes
  // the row sums of op(A) (type of D: fp32) into the scratch vector, which is then added to the gradient.
  require_fp32(g.bias_grad, "bias gradient");
  require_contiguous(g.bias_grad, "bias gradient");
  if (epilogues_.wgrad_bias && g.bias.empty() && scratch_.numel() >= g.m) {
    cuda::GemmSpec fused = spec;
    fused.epilogue = cuda::GemmEpilogue::kBGradA;
    args.bias_grad = scratch_.data;
    if (gemm_->supports(fused, args)) {
      gemm_->run(fused, args, compute_);
      cuda::axpby_fp32(1.0f, f32(scratch_), 1.0f, f32(g.bias_grad), g.m, compute_);
      ++wgrad_bias_use_.fused;
      return;
    }
    args.bias_grad = nullptr;
  }
  ++wgrad_bias_use_.unfused;
  gemm_->run(spec, args, compute_);
  do_bias_grad(g.a, g.bias_grad);  // column sums of dY stored (k, m)
}

void CudaBackend::do_grouped_gemm(const std::vector<GemmArgs>& gemms) {
  // One cuBLASLt GEMM per local expert on plans bucketed by the expert's row count (GemmRunner::run_ragged):
  // faster than cuBLAS's grouped GEMM on the Mixtral-shaped expert GEMMs (bench/grouped_gemm_gpu.cpp,
  // bench/RESULTS.md), and a changing count neither re-tunes nor grows the plan cache.
  for (const GemmArgs& g : gemms) {
    if (!g.bias.empty() || !g.bias_grad.empty()) {
      do_gemm(g);
      continue;
    }
    gemm_->run_ragged(gemm_spec(g), gemm_pointers(g), compute_);
  }
}

void CudaBackend::do_linear_gelu_forward(const GemmArgs& g, Tensor out) {
  cuda::GemmSpec spec = gemm_spec(g);
  spec.epilogue = g.bias.empty() ? cuda::GemmEpilogue::kGeluAux : cuda::GemmEpilogue::kGeluAuxBias;
  // cuBLASLt's GELU epilogues: D = gelu(A.B + bias) with the leading dimension of D, aux = A.B + bias.
  spec.ldd = out.row_stride;
  spec.ld_aux = g.c.row_stride;
  require_bf16(out, "GELU output");
  cuda::GemmArgs args = gemm_pointers(g);
  args.d = out.data;
  args.aux = g.c.data;
  if (epilogues_.gelu_forward && g.c.dtype == DType::kBF16 && gemm_->supports(spec, args)) {
    gemm_->run(spec, args, compute_);
    ++gelu_forward_use_.fused;
    return;
  }
  ++gelu_forward_use_.unfused;
  Backend::do_linear_gelu_forward(g, out);
}

void CudaBackend::do_fp8_cast(const Fp8CastArgs& a) {
  require_bf16(a.src, "FP8 cast input");
  require_fp32(a.state, "FP8 scaling state");
  cuda::Fp8CastLaunch launch;
  launch.src = b16(a.src);
  launch.rows = a.src.rows;
  launch.cols = a.src.cols;
  launch.ld = a.src.row_stride;
  for (const Tensor* t : {&a.out, &a.out_transposed})
    if (!t->empty()) require_contiguous(*t, "FP8 cast output");
  launch.out = a.out.empty() ? nullptr : static_cast<std::uint8_t*>(a.out.data);
  launch.out_t = a.out_transposed.empty() ? nullptr : static_cast<std::uint8_t*>(a.out_transposed.data);
  launch.state = f32(a.state);
  launch.e5m2 = a.encoding == layouts::Fp8Encoding::kE5M2;
  launch.current_scaling = a.current_scaling;
  launch.margin = a.margin;
  launch.history_len = a.history_len;
  launch.amax_max = a.amax_max;
  cuda::fp8_cast(launch, compute_);
  if (!a.bias_grad.empty()) do_bias_grad(a.src, a.bias_grad);
}

void CudaBackend::do_bias_grad(Tensor d_out, Tensor d_bias) {
  require_bf16(d_out, "bias gradient input");
  require_contiguous(d_out, "bias gradient input");
  cuda::column_sum_bf16(b16(d_out), f32(d_bias), d_out.rows, d_out.cols, /*accumulate=*/true, scratch_.data,
                        static_cast<std::size_t>(scratch_.numel() * 4), compute_);
}

void CudaBackend::do_embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq,
                                       Tensor out) {
  if (!position_table.empty() && position_table.dtype != table.dtype)
    throw std::logic_error("cuda backend: word and position tables must share a dtype");
  if (table.dtype == DType::kFP32) {  // the fp32 main parameters (no bf16 copy of the tables)
    cuda::embedding_forward(static_cast<const std::int32_t*>(tokens.data), f32(table),
                            position_table.empty() ? nullptr : f32(position_table), b16(out), out.rows, seq,
                            table.rows, table.cols, compute_);
    return;
  }
  cuda::embedding_forward(static_cast<const std::int32_t*>(tokens.data), b16(table),
                          position_table.empty() ? nullptr : b16(position_table), b16(out), out.rows, seq,
                          table.rows, table.cols, compute_);
}

void CudaBackend::do_embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                                        Tensor d_position_table) {
  cuda::embedding_backward(static_cast<const std::int32_t*>(tokens.data), b16(d_out), f32(d_table),
                           d_position_table.empty() ? nullptr : f32(d_position_table), d_out.rows, seq,
                           d_table.rows, d_table.cols, scratch_.data,
                           static_cast<std::size_t>(scratch_.numel() * 4), compute_);
}

void CudaBackend::do_norm_forward(const NormArgs& a) {
  const bool residual = !a.residual.empty();
  if (a.stats_given && !residual) {  // a recompute: the stored statistics, no reductions
    cuda::norm_apply(a.kind, b16(a.x), b16(a.gamma), a.beta.empty() ? nullptr : b16(a.beta),
                     a.mean.empty() ? nullptr : f32(a.mean), f32(a.rstd), b16(a.out), a.x.rows, a.x.cols,
                     compute_);
    return;
  }
  cuda::norm_forward(a.kind, b16(a.x), residual ? b16(a.residual) : nullptr, b16(a.gamma),
                     a.beta.empty() ? nullptr : b16(a.beta), b16(a.out), residual ? b16(a.sum_out) : nullptr,
                     a.mean.empty() ? nullptr : f32(a.mean), f32(a.rstd), a.x.rows, a.x.cols, a.eps,
                     compute_);
}

void CudaBackend::do_norm_backward(const NormArgs& a, Tensor d_out, Tensor d_residual, Tensor d_x,
                                   Tensor d_gamma, Tensor d_beta) {
  const Tensor input = a.residual.empty() ? a.x : a.sum_out;
  cuda::norm_backward(a.kind, b16(d_out), b16(input), b16(a.gamma), a.mean.empty() ? nullptr : f32(a.mean),
                      f32(a.rstd), d_residual.empty() ? nullptr : b16(d_residual), b16(d_x), f32(d_gamma),
                      d_beta.empty() ? nullptr : f32(d_beta), input.rows, input.cols, /*accumulate=*/true,
                      scratch_.data, static_cast<std::size_t>(scratch_.numel() * 4), compute_);
}

void CudaBackend::do_rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                          std::int64_t head_dim, float theta, bool inverse, std::int64_t position_offset,
                          const RopeScaling& scaling) {
  AttentionShape s;
  s.batch = qkv.rows / seq;
  s.seq_q = seq;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.q_token_stride = qkv.row_stride;
  s.k_token_stride = qkv.row_stride;
  bf16* q = b16(qkv);
  bf16* k = q + s.packed_k_offset();
  if (inverse) {
    cuda::rope_backward_inplace(s, q, k, theta, position_offset, compute_, scaling);
  } else {
    cuda::rope_forward_inplace(s, q, k, theta, position_offset, compute_, scaling);
  }
}

std::string CudaBackend::attention_unsupported(const AttentionShape& shape) const {
  return cuda::flash_attention_unsupported(shape);
}

void CudaBackend::do_attention_forward(const AttentionArgs& a) {
  cuda::flash_attention_forward(attention_shape(a), b16(a.q), b16(a.k), b16(a.v), b16(a.out), f32(a.lse),
                                compute_);
}

void CudaBackend::do_attention_backward(const AttentionArgs& a, const AttentionGrads& g) {
  cuda::flash_attention_backward(attention_shape(a, g), b16(a.q), b16(a.k), b16(a.v), b16(a.out), f32(a.lse),
                                 b16(g.d_out), b16(g.dq), b16(g.dk), b16(g.dv), scratch_.data,
                                 static_cast<std::size_t>(scratch_.numel() * 4), compute_);
}

void CudaBackend::do_activation_forward(ActivationKind kind, Tensor in, Tensor out) {
  require_contiguous(in, "activation input");
  require_contiguous(out, "activation output");
  if (kind == ActivationKind::kGelu) {
    cuda::bias_gelu_forward(b16(in), nullptr, nullptr, b16(out), in.rows, in.cols, compute_);
  } else {
    cuda::swiglu_forward(b16(in), b16(out), in.rows, out.cols, compute_);
  }
}

void CudaBackend::do_activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in) {
  if (kind == ActivationKind::kGelu) {
    cuda::gelu_backward(b16(d_out), b16(in), b16(d_in), in.rows, in.cols, compute_);
  } else {
    cuda::swiglu_backward(b16(d_out), b16(in), b16(d_in), in.rows, d_out.cols, compute_);
  }
}

void CudaBackend::do_activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                                   Tensor out) {
  for (const Tensor* t : {&in, &d_out, &d_in, &out}) {
    require_bf16(*t, "activation backward tensor");
    require_contiguous(*t, "activation backward tensor");
  }
  if (kind == ActivationKind::kGelu) {
    cuda::gelu_backward_recompute(b16(d_out), b16(in), b16(d_in), b16(out), in.rows, in.cols, compute_);
  } else {
    cuda::swiglu_backward_recompute(b16(d_out), b16(in), b16(d_in), b16(out), in.rows, d_out.cols, compute_);
  }
}

void CudaBackend::do_cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale) {
  require_contiguous(logits, "logits");
  cuda::cross_entropy_forward_backward(b16(logits), static_cast<const std::int32_t*>(targets.data),
                                       f32(losses), logits.rows, logits.cols, /*write_gradient=*/true,
                                       grad_scale, compute_);
}

void CudaBackend::do_cross_entropy_row_max(Tensor logits, Tensor row_max) {
  require_contiguous(logits, "logits");
  cuda::cross_entropy_row_max(b16(logits), f32(row_max), logits.rows, logits.cols, compute_);
}

void CudaBackend::do_cross_entropy_target_sum_exp(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                                  const CrossEntropyStats& stats) {
  require_contiguous(logits, "logits");
  cuda::cross_entropy_target_sum_exp(b16(logits), static_cast<const std::int32_t*>(targets.data),
                                     f32(stats.row_max), f32(stats.target_logit), f32(stats.sum_exp),
                                     logits.rows, logits.cols, vocab_offset, compute_);
}

void CudaBackend::do_cross_entropy_finish(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                          const CrossEntropyStats& stats, Tensor losses, float grad_scale) {
  require_contiguous(logits, "logits");
  cuda::cross_entropy_finish(b16(logits), static_cast<const std::int32_t*>(targets.data), f32(stats.row_max),
                             f32(stats.target_logit), f32(stats.sum_exp), f32(losses), logits.rows,
                             logits.cols, vocab_offset, grad_scale, compute_);
}

void CudaBackend::do_add(Tensor a, Tensor b, Tensor out) {
  require_contiguous(out, "add output");
  cuda::add_bf16(b16(a), b16(b), b16(out), out.numel(), compute_);
}

void CudaBackend::do_cast(Tensor src, Tensor dst) { copy(src, dst); }

void CudaBackend::do_attention_merge(const AttentionMergeArgs& a) {
  require_contiguous(a.block_out, "attention merge block output");
  AttentionMergeShape shape = a.shape;
  shape.out_stride = a.out.row_stride;
  cuda::attention_merge(shape, b16(a.out), f32(a.lse), b16(a.block_out), f32(a.block_lse), compute_);
}

void CudaBackend::prepare_optimizer(std::vector<OptimizerTensor> tensors) {
  std::vector<cuda::AdamWTensor> table, norm_table;
  optimizer_elements_ = 0;
  for (const OptimizerTensor& t : tensors) {
    cuda::AdamWTensor a;
    a.main_param = f32(t.main_param);
    a.main_grad = f32(t.main_grad);
    a.exp_avg = f32(t.exp_avg);
    a.exp_avg_sq = f32(t.exp_avg_sq);
    a.model_param = t.model_param.dtype == DType::kBF16 ? b16(t.model_param) : nullptr;
    a.numel = t.main_param.numel();
    a.apply_weight_decay = t.apply_weight_decay ? 1 : 0;
    a.decoupled_lr = t.decoupled_lr ? 1 : 0;
    optimizer_elements_ += a.numel;
    table.push_back(a);
    if (t.in_grad_norm) norm_table.push_back(a);
  }
  optimizer_table_ = std::make_unique<cuda::MultiTensorTable>(std::move(table));
  grad_norm_table_ = std::make_unique<cuda::MultiTensorTable>(std::move(norm_table));
  cudaFree(grad_norm_workspace_);
  grad_norm_workspace_bytes_ = cuda::grad_norm_workspace_bytes(*grad_norm_table_);
  MEGATUNE_CUDA_CHECK(
      cudaMalloc(&grad_norm_workspace_, std::max<std::size_t>(grad_norm_workspace_bytes_, 256)));
}

float CudaBackend::do_grad_norm() {
  cuda::global_grad_norm(*grad_norm_table_, grad_norm_device_, grad_norm_workspace_,
                         grad_norm_workspace_bytes_, compute_);
  float norm = 0.0f;
  MEGATUNE_CUDA_CHECK(
      cudaMemcpyAsync(&norm, grad_norm_device_, sizeof(float), cudaMemcpyDeviceToHost, compute_));
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return norm;
}

void CudaBackend::on_op_begin(const layouts::Op& op) {
  if (timed_.size() == timing_events_.size()) {
    cudaEvent_t start = nullptr, stop = nullptr;
    MEGATUNE_CUDA_CHECK(cudaEventCreate(&start));
    MEGATUNE_CUDA_CHECK(cudaEventCreate(&stop));
    timing_events_.emplace_back(start, stop);
  }
  MEGATUNE_CUDA_CHECK(cudaEventRecord(timing_events_[timed_.size()].first, compute_));
  timed_.push_back(op);
}

void CudaBackend::on_op_end() {
  MEGATUNE_CUDA_CHECK(cudaEventRecord(timing_events_[timed_.size() - 1].second, compute_));
}

std::vector<Backend::TimedOp> CudaBackend::timed_ops() {
  synchronize();
  std::vector<TimedOp> out;
  out.reserve(timed_.size());
  for (std::size_t i = 0; i < timed_.size(); ++i) {
    float ms = 0.0f;
    MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_events_[i].first, timing_events_[i].second));
    float start_ms = 0.0f;
    MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&start_ms, timing_events_[0].first, timing_events_[i].first));
    out.push_back({std::move(timed_[i]), ms, start_ms});
  }
  timed_.clear();
  return out;
}

Backend::DeviceSample CudaBackend::sample_device() {
  if (!nvml_) {
    char bus_id[32] = "";
    MEGATUNE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_));
    nvml_ = std::make_unique<cuda::NvmlSampler>(bus_id);
  }
  return {nvml_->sm_clock_mhz(), nvml_->power_w()};
}

std::int64_t CudaBackend::device_memory_used_bytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  MEGATUNE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<std::int64_t>(total_bytes - free_bytes);
}

void CudaBackend::do_set_grad_norm(float norm) {
  MEGATUNE_CUDA_CHECK(
      cudaMemcpyAsync(grad_norm_device_, &norm, sizeof(float), cudaMemcpyHostToDevice, compute_));
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(compute_));  // `norm` lives on this stack frame
}

void CudaBackend::do_scale(Tensor t, float factor) {
  if (t.dtype != DType::kFP32 || t.is_int32) throw std::logic_error("cuda backend: scale takes fp32 tensors");
  require_contiguous(t, "scaled tensor");
  cuda::scale_fp32_inplace(f32(t), t.numel(), factor, compute_);
}

void CudaBackend::do_adamw_step(const AdamWHyper& hyper) {
  cuda::adamw_step(*optimizer_table_, hyper, grad_norm_device_, compute_);
}

}  // namespace megatune::executor
