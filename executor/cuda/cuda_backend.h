// CudaBackend: the Backend on one GPU: bf16 weights and activations with fp32 statistics, gradients and
// optimizer state; cuBLASLt GEMMs, flash attention and the fused kernels of executor/cuda; one device arena
// reserved up front; a compute stream and a communication stream per process group (created on first
// use), ordered by events.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/cuda/nvml_sampler.h"

namespace megatune::executor {

namespace cuda {
class GemmRunner;
class MoeIndexCache;
class MultiTensorTable;
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  static int device_count();  // 0 when no GPU or no driver
  struct MemoryInfo {
    std::int64_t free_bytes = 0, total_bytes = 0;
  };
  static MemoryInfo memory_info(int device);  // cudaMemGetInfo on `device` (creates its context)
  std::string name() const override;
  std::string device_name() const { return device_name_; }
  std::int64_t storage_bytes(DType dtype) const override;
  // Device memory this backend holds: the arena plus the fixed workspaces (GEMM, optimizer table).
  std::int64_t device_bytes() const;
  cudaStream_t compute_stream() const { return compute_; }
  // The CUDA stream of `stream`: the compute stream, or the communication stream of stream.group (where
  // the Communicator issues that group's work), created on first use.
  cudaStream_t cuda_stream(Stream stream);
  // The communication streams created so far.
  std::vector<cudaStream_t> communication_streams() const;
  // How often each fused GEMM epilogue ran fused, and how often it fell back to the unfused kernels
  // (cuBLASLt offered no algorithm, or the widths / pointers are outside its rules).
  struct EpilogueUse {
    std::int64_t fused = 0, unfused = 0;
  };
  EpilogueUse gelu_forward_use() const { return gelu_forward_use_; }  // GELU_AUX(_BIAS)
  EpilogueUse wgrad_bias_use() const { return wgrad_bias_use_; }      // BGRADB
  // Which fused cuBLASLt epilogues the backend asks for. Defaults by measurement (H200, cuBLASLt 13.0,
  // gpt-1.3b shapes, m = 8192 tokens): GELU_AUX_BIAS costs +15% over the plain GEMM and saves a separate
  // GELU pass, so it is on; BGRADB was no faster than the plain weight-gradient GEMM plus a separate
  // column sum (~0.01-0.03 ms), so it is off. (DGELU_BGRAD, 2.7x slower than the plain data-gradient GEMM,
  // is not used: the model's MLP backward runs one activation pass after a plain data gradient.)
  struct GemmEpilogues {
    bool gelu_forward = true;  // GELU_AUX(_BIAS) in linear + GELU
    bool wgrad_bias = false;   // BGRADB: the bias gradient in the weight-gradient GEMM
  };
  void set_gemm_epilogues(GemmEpilogues epilogues) { epilogues_ = epilogues; }
  GemmEpilogues gemm_epilogues() const { return epilogues_; }
  // Host-device transfers of the MoE permutation kernels: plan uploads (one H2D copy each) and the
  // probability-gradient downloads (one D2H copy and a wait each), counted since construction.
  struct MoeTransfers {
    std::int64_t plan_uploads = 0, d_probs_downloads = 0;
  };
  MoeTransfers moe_transfers() const;

  void upload_int32(Tensor dst, const std::int32_t* host) override;
  void fill_zero(Tensor t) override;
  void copy(Tensor src, Tensor dst) override;

  Event record_event(Stream stream) override;
  void wait_event(Stream waiting, Event event) override;
  void synchronize() override;

  std::int64_t scratch_bytes(const ScratchNeeds& needs) const override;
  std::string attention_unsupported(const AttentionShape& shape) const override;
  std::string norm_unsupported(std::int64_t width) const override { return norm_width_unsupported(width); }
  // The norm kernels' rule on row widths (empty: taken), for sizing without a GPU too.
  static std::string norm_width_unsupported(std::int64_t width);
  void prepare_optimizer(std::vector<OptimizerTensor> tensors) override;
  std::vector<TimedOp> timed_ops() override;
  std::int64_t device_memory_used_bytes() override;
  DeviceSample sample_device() override;

 protected:
  void on_op_begin(const layouts::Op& op) override;
  void on_op_end() override;
  void* reserve_memory(std::int64_t bytes) override;
  void do_upload(Tensor dst, const float* host, Stream stream) override;
  void do_download(Tensor src, float* host, Stream stream) override;
  void* reserve_block(std::int64_t bytes) override;
  void free_block(void* block) override;
  void do_gemm(const GemmArgs& args) override;
  void do_grouped_gemm(const std::vector<GemmArgs>& gemms) override;
  void do_bias_grad(Tensor d_out, Tensor d_bias) override;
  void do_linear_gelu_forward(const GemmArgs& args, Tensor out) override;
  void do_embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq,
                            Tensor out) override;
  void do_embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                             Tensor d_position_table) override;
  void do_norm_forward(const NormArgs& args) override;
  void do_norm_backward(const NormArgs& args, Tensor d_out, Tensor d_residual, Tensor d_x, Tensor d_gamma,
                        Tensor d_beta) override;
  void do_rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
               float theta, bool inverse, std::int64_t position_offset, const RopeScaling& scaling) override;
  void do_attention_forward(const AttentionArgs& args) override;
  void do_attention_backward(const AttentionArgs& args, const AttentionGrads& grads) override;
  void do_activation_forward(ActivationKind kind, Tensor in, Tensor out) override;
  void do_activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in) override;
  void do_activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                        Tensor out) override;
  void do_cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale) override;
  void do_cross_entropy_row_max(Tensor logits, Tensor row_max) override;
  void do_cross_entropy_target_sum_exp(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                       const CrossEntropyStats& stats) override;
  void do_cross_entropy_finish(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                               const CrossEntropyStats& stats, Tensor losses, float grad_scale) override;
  void do_moe_permute(Tensor x, const MoePermutation& plan, Tensor out) override;
  void do_moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out) override;
  void do_moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan, Tensor d_rows,
                                 std::vector<float>& d_probs) override;
  void do_add(Tensor a, Tensor b, Tensor out) override;
  void do_attention_merge(const AttentionMergeArgs& args) override;
  void do_cast(Tensor src, Tensor dst) override;
  void do_fp8_cast(const Fp8CastArgs& args) override;
  void do_scale(Tensor t, float factor) override;
  float do_grad_norm() override;
  void do_set_grad_norm(float norm) override;
  void do_adamw_step(const AdamWHyper& hyper) override;

 private:
  static constexpr int kEventPoolSize = 256;
  int device_ = 0;
  std::unique_ptr<cuda::NvmlSampler> nvml_;  // created on the first sample_device()
  std::string device_name_;
  cudaStream_t compute_ = nullptr;
  std::array<cudaStream_t, layouts::kCommGroupCount> communication_{};  // by group; null until first use
  std::vector<cudaEvent_t> events_;
  int next_event_ = 0;
  void* arena_ = nullptr;
  std::vector<void*> blocks_;  // allocate_block()'s, freed with the backend
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::unique_ptr<cuda::MoeIndexCache> moe_indices_;
  // upload() / download() of small contiguous tensors: one pinned buffer (allocated on first use), or null
  // for a tensor that takes the pitched pageable copy. The buffer is handed out only once the last copy
  // from it has run (pinned_staging_done_, recorded after each upload's asynchronous copy): two uploads in a
  // row never overwrite a copy still in flight.
  static constexpr std::size_t kPinnedStagingBytes = std::size_t(8) << 20;
  void* small_transfer_staging(const Tensor& t);
  void* pinned_staging_ = nullptr;
  cudaEvent_t pinned_staging_done_ = nullptr;
  std::int64_t moe_d_probs_downloads_ = 0;
  std::unique_ptr<cuda::MultiTensorTable> optimizer_table_;
  std::unique_ptr<cuda::MultiTensorTable> grad_norm_table_;  // the tensors flagged in_grad_norm
  void* grad_norm_workspace_ = nullptr;
  std::size_t grad_norm_workspace_bytes_ = 0;
  float* grad_norm_device_ = nullptr;
  // Op timing: event pairs (created on first use, reused) and the ops they bracket.
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timing_events_;
  std::vector<layouts::Op> timed_;
  EpilogueUse gelu_forward_use_, wgrad_bias_use_;
  GemmEpilogues epilogues_;
};

}  // namespace megatune::executor
