// SizingBackend: a Backend that only counts: it stores each dtype in its logical size (as the CUDA backend
// does) and runs no kernel, so a model's arena and its breakdown can be computed anywhere, GPU or not.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/backend/backend.h"

namespace megatune::executor {

class SizingBackend final : public Backend {
 public:
  // scratch_bytes answers Backend::scratch_bytes (the kernel workspace the model allocates from the arena);
  // none by default. attention_unsupported and norm_unsupported answer Backend's for the backend being
  // sized (the CUDA kernels' rules); by default every shape and width is taken.
  explicit SizingBackend(std::function<std::int64_t(const ScratchNeeds&)> scratch_bytes = {},
                         std::function<std::string(const AttentionShape&)> attention_unsupported = {},
                         std::function<std::string(std::int64_t)> norm_unsupported = {})
      : scratch_bytes_(std::move(scratch_bytes)),
        attention_unsupported_(std::move(attention_unsupported)),
        norm_unsupported_(std::move(norm_unsupported)) {}
  std::string name() const override { return "sizing"; }
  std::int64_t storage_bytes(DType dtype) const override { return layouts::dtype_bytes(dtype); }
  std::int64_t scratch_bytes(const ScratchNeeds& needs) const override {
    return scratch_bytes_ ? scratch_bytes_(needs) : 0;
  }
  std::string attention_unsupported(const AttentionShape& shape) const override {
    return attention_unsupported_ ? attention_unsupported_(shape) : std::string();
  }
  std::string norm_unsupported(std::int64_t width) const override {
    return norm_unsupported_ ? norm_unsupported_(width) : std::string();
  }

  void upload_int32(Tensor, const std::int32_t*) override { refuse(); }
  void fill_zero(Tensor) override { refuse(); }
  void copy(Tensor, Tensor) override { refuse(); }
  Event record_event(Stream) override { return 0; }
  void wait_event(Stream, Event) override {}
  void synchronize() override {}
  void prepare_optimizer(std::vector<OptimizerTensor>) override { refuse(); }

 protected:
  void* reserve_memory(std::int64_t) override { refuse(); }
  void do_upload(Tensor, const float*, Stream) override { refuse(); }
  void do_download(Tensor, float*, Stream) override { refuse(); }
  void* reserve_block(std::int64_t) override { refuse(); }
  void free_block(void*) override { refuse(); }
  void do_gemm(const GemmArgs&) override { refuse(); }
  void do_bias_grad(Tensor, Tensor) override { refuse(); }
  void do_embedding_forward(Tensor, Tensor, Tensor, std::int64_t, Tensor) override { refuse(); }
  void do_embedding_backward(Tensor, Tensor, std::int64_t, Tensor, Tensor) override { refuse(); }
  void do_norm_forward(const NormArgs&) override { refuse(); }
  void do_norm_backward(const NormArgs&, Tensor, Tensor, Tensor, Tensor, Tensor) override { refuse(); }
  void do_rope(Tensor, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, bool, std::int64_t,
               const RopeScaling&) override {
    refuse();
  }
  void do_attention_forward(const AttentionArgs&) override { refuse(); }
  void do_attention_backward(const AttentionArgs&, const AttentionGrads&) override { refuse(); }
  void do_activation_forward(ActivationKind, Tensor, Tensor) override { refuse(); }
  void do_activation_backward(ActivationKind, Tensor, Tensor, Tensor) override { refuse(); }
  void do_activation_backward_recompute(ActivationKind, Tensor, Tensor, Tensor, Tensor) override { refuse(); }
  void do_cross_entropy(Tensor, Tensor, Tensor, float) override { refuse(); }
  void do_cross_entropy_row_max(Tensor, Tensor) override { refuse(); }
  void do_cross_entropy_target_sum_exp(Tensor, Tensor, std::int64_t, const CrossEntropyStats&) override {
    refuse();
  }
  void do_cross_entropy_finish(Tensor, Tensor, std::int64_t, const CrossEntropyStats&, Tensor,
                               float) override {
    refuse();
  }
  void do_add(Tensor, Tensor, Tensor) override { refuse(); }
  void do_attention_merge(const AttentionMergeArgs&) override { refuse(); }
  void do_cast(Tensor, Tensor) override { refuse(); }
  void do_fp8_cast(const Fp8CastArgs&) override { refuse(); }
  void do_scale(Tensor, float) override { refuse(); }
  float do_grad_norm() override { refuse(); }
  void do_set_grad_norm(float) override { refuse(); }
  void do_adamw_step(const AdamWHyper&) override { refuse(); }

 private:
  [[noreturn]] static void refuse();
  std::function<std::int64_t(const ScratchNeeds&)> scratch_bytes_;
  std::function<std::string(const AttentionShape&)> attention_unsupported_;
  std::function<std::string(std::int64_t)> norm_unsupported_;
};

// One line per arena label with GiB and share, then the total; for logs and benchmark output.
std::string format_arena_breakdown(const std::vector<ArenaUse>& breakdown);

}  // namespace megatune::executor
