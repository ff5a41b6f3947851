// GpuTransfer: prices an op on a GPU without measurements from its price on a profiled GPU. The profiled
// GPU's time at the op's shape is taken as an achieved fraction of that GPU's roofline
// max(FLOPs / peak, bytes / bandwidth); the same fraction of the target's roofline is the target's time.
// So a large compute-bound GEMM scales with the FLOP/s ratio, a memory-bound kernel with the bandwidth
// ratio, a small or skinny shape keeps its low efficiency, and a shape memory-bound on the target (its
// ridge point FLOP/s / bandwidth is higher) is priced as such. The launch-latency floor is not scaled.
#pragma once
#include <cstdint>

#include "cost_models/attention_cost_model.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"
#include "layouts/op.h"

namespace megatune::cost_models {

class GpuTransfer {
 public:
  GpuTransfer(const GpuModel& profiled, const GpuModel& target, double kernel_launch_latency_s);

  double gemm_time_s(double profiled_time_s, std::int64_t m, std::int64_t n, std::int64_t k,
                     layouts::DType dtype) const;
  double attention_time_s(double profiled_time_s, AttentionDirection direction,
                          const layouts::AttentionShape& shape, layouts::DType dtype) const;
  double memory_bound_time_s(double profiled_time_s) const;

  const GpuModel& profiled() const { return profiled_; }
  const GpuModel& target() const { return target_; }

 private:
  // The target's time of an op of `flops` and `bytes` that took `profiled_time_s` on the profiled GPU.
  double roofline_transfer_s(double profiled_time_s, double flops, double bytes, layouts::DType dtype) const;
  GpuModel profiled_;
  GpuModel target_;
  double kernel_launch_latency_s_;
};

}  // namespace megatune::cost_models
