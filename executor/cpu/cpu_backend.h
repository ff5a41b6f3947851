// CpuBackend: the Backend on the host with the float reference kernels (Eigen GEMMs). Every floating
// dtype is stored as float; with emulate_bf16, outputs of bf16 tensors are rounded to bf16 after each kernel.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "executor/backend/backend.h"

namespace megatune::executor {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool emulate_bf16 = false) : emulate_bf16_(emulate_bf16) {}
  std::string name() const override { return emulate_bf16_ ? "cpu (bf16 emulated)" : "cpu"; }
  std::int64_t storage_bytes(DType) const override { return 4; }

  void upload_int32(Tensor dst, const std::int32_t* host) override;
  void fill_zero(Tensor t) override;
  void copy(Tensor src, Tensor dst) override;

  // One host thread: every stream is the calling thread, everything is already ordered.
  Event record_event(Stream) override { return 0; }
  void wait_event(Stream, Event) override {}
  void synchronize() override {}

  void prepare_optimizer(std::vector<OptimizerTensor> tensors) override;
  std::vector<TimedOp> timed_ops() override;
  // With op timing on: ends the timed op `from_last` places before the newest one now. The Communicator
  // records a collective (a zero-length bracket) just before the transfer runs; the ThreadCommunicator
  // calls this when its transfer is done, so the op covers the exchange and the wait for the peers.
  void end_timed_op_now(std::size_t from_last);

 protected:
  // Host-clock op timing (the kernels run synchronously on the calling thread).
  void on_op_begin(const layouts::Op& op) override;
  void on_op_end() override;
  void* reserve_memory(std::int64_t bytes) override;
  void do_upload(Tensor dst, const float* host, Stream stream) override;
  void do_download(Tensor src, float* host, Stream stream) override;
  void* reserve_block(std::int64_t bytes) override;
  void free_block(void* block) override;
  void do_gemm(const GemmArgs& args) override;
  void do_bias_grad(Tensor d_out, Tensor d_bias) override;
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
  void do_add(Tensor a, Tensor b, Tensor out) override;
  void do_attention_merge(const AttentionMergeArgs& args) override;
  void do_cast(Tensor src, Tensor dst) override;
  void do_fp8_cast(const Fp8CastArgs& args) override;
  void do_scale(Tensor t, float factor) override;
  float do_grad_norm() override;
  void do_set_grad_norm(float norm) override { last_grad_norm_ = norm; }
  void do_adamw_step(const AdamWHyper& hyper) override;

 private:
  void round_if_bf16(Tensor t);
  bool emulate_bf16_;
  std::unique_ptr<float[]> arena_;
  std::vector<std::unique_ptr<float[]>> blocks_;  // allocate_block()'s
  std::vector<OptimizerTensor> optimizer_tensors_;
  float last_grad_norm_ = 0.0f;
  std::vector<TimedOp> timed_;
  std::chrono::steady_clock::time_point first_start_, op_start_;
};

}  // namespace megatune::executor
