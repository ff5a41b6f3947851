// The microbenchmarks of a profiling sweep: one struct per kind of work (GEMM through the executor's
// cuBLASLt path, flash attention, a memory-bound kernel, an NCCL collective), each with the database row it
// fills (its natural-key fields set, the timing left to the runner).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cost_models/op_cost.h"
#include "cost_models/records.h"
#include "layouts/op.h"

namespace megatune::profiler {

// Which of the executor's linear-layer GEMMs (executor/cuda/gemm_runner.h) an item runs. The step
// program's (m, n, k) is the GEMM's (m, n, k) in all three:
//   kForward:        y = x . w^T       (TN, bf16 out)        m = tokens, n = out, k = in
//   kBackwardData:   dx = dy . w       (NN, bf16 out)        m = tokens, n = in,  k = out
//   kBackwardWeight: main_grad += dy^T . x (TN^T, fp32 out, beta 1)   m = out, n = in, k = tokens
enum class GemmVariant : std::uint8_t { kForward, kBackwardData, kBackwardWeight };
const char* gemm_variant_name(GemmVariant variant);  // "fwd" | "dgrad" | "wgrad"

// The fused epilogue the executor's helper uses for that GEMM.
enum class GemmFusion : std::uint8_t { kNone, kBias, kGeluAux, kGeluAuxBias, kDGeluBiasGrad };

struct GemmItem {
  std::int64_t m = 0, n = 0, k = 0;
  GemmVariant variant = GemmVariant::kForward;
  GemmFusion fusion = GemmFusion::kNone;
  layouts::DType dtype = layouts::DType::kBF16;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct AttentionItem {
  bool backward = false;
  layouts::AttentionShape shape;  // seq_q == seq_kv for the executor's self-attention kernels
  layouts::DType dtype = layouts::DType::kBF16;
};

// A memory-bound kernel moving `bytes` (read + written, the step program's accounting for `kind`), with
// rows of `columns` elements (hidden, ffn / tp, vocab / tp, ...; 0 for flat kernels such as the optimizer).
// dtype kFP8 (kind kElementwise): a cast of an FP8 linear (layouts/fp8.h) of cast_elements() bf16 values into
// cast_outputs FP8 copies (1: one, 2: also its transpose), current scaling's amax pass first when
// cast_current_scaling; stored as an "elementwise" row of dtype fp8.
struct MemoryBoundItem {
  layouts::OpKind kind = layouts::OpKind::kNorm;
  std::int64_t bytes = 0;
  std::int64_t columns = 0;
  bool swiglu = false;   // activation kinds: SwiGLU (else GELU)
  bool rms_norm = true;  // norm kinds: RMSNorm (else LayerNorm)
  layouts::DType dtype = layouts::DType::kBF16;
  int cast_outputs = 0;
  bool cast_current_scaling = false;
  bool is_fp8_cast() const { return dtype == layouts::DType::kFP8; }
  // The bf16 values a cast reads: bytes / (2 per read pass + 1 per FP8 copy), layouts::fp8_cast_bytes.
  std::int64_t cast_elements() const { return bytes / (2 * (cast_current_scaling ? 2 : 1) + cast_outputs); }
};

// One NCCL collective over `group_size` ranks of one node; bytes in nccl-tests' convention
// (cost_models/records.h).
struct CollectiveItem {
  cost_models::CollectiveOp op = cost_models::CollectiveOp::kAllReduce;
  int group_size = 2;
  std::int64_t bytes = 0;
};

struct Sweep {
  std::vector<GemmItem> gemms;
  std::vector<AttentionItem> attention;
  std::vector<MemoryBoundItem> memory_bound;
  std::vector<CollectiveItem> collectives;
  std::size_t kernel_count() const { return gemms.size() + attention.size() + memory_bound.size(); }
  std::size_t size() const { return kernel_count() + collectives.size(); }
};

// The database row each item fills, natural-key fields set (gpu, versions and timings empty).
cost_models::KernelTiming kernel_timing_key(const GemmItem& item);
cost_models::KernelTiming kernel_timing_key(const AttentionItem& item);
cost_models::KernelTiming kernel_timing_key(const MemoryBoundItem& item);
cost_models::CollectiveTiming collective_timing_key(const CollectiveItem& item);

// Same measurement (the natural key without gpu/versions/timings).
bool same_kernel_key(const cost_models::KernelTiming& a, const cost_models::KernelTiming& b);
bool same_collective_key(const cost_models::CollectiveTiming& a, const cost_models::CollectiveTiming& b);

// One line for logs: "gemm 4096x4096x4096 fwd bf16", "all_reduce n=2 1.0 MiB".
std::string describe(const GemmItem& item);
std::string describe(const AttentionItem& item);
std::string describe(const MemoryBoundItem& item);
std::string describe(const CollectiveItem& item);
std::string format_bytes(std::int64_t bytes);  // "512 B", "4.0 KiB", "1.0 GiB"

}  // namespace megatune::profiler
