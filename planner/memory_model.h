// Memory model: the peak device memory of each pipeline rank under a parallel config, itemized
// (weights, gradients, optimizer state, activations of in-flight microbatches, logits, buffers, margins).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::planner {

struct MemoryOptions {
  // Flash attention (the executor's and Megatron+TE's): no s^2 score/softmax tensors are saved.
  bool flash_attention = true;
  // Megatron's vocab-parallel cross entropy keeps an fp32 copy of the logits for backward.
  bool fp32_logits_copy = true;
  // Hidden dropout masks (1 byte per element) after attention and MLP: 1 on, 0 off, -1 (default) on for
  // LayerNorm (GPT-style) models and off for RMSNorm (Llama-style, trained without dropout).
  int hidden_dropout = -1;
  bool grad_reduce_in_bf16 = false;
  std::int64_t cuda_context_bytes = 512LL << 20;  // CUDA context + module images
  std::int64_t cublas_workspace_bytes = 32LL << 20;
  std::int64_t nccl_buffer_bytes_per_group = 64LL << 20;  // per communicator the rank belongs to (> 1 rank)
  double fragmentation_fraction = 0.05;                   // allocator margin on everything allocated
  layouts::StepProgramOptions step;                       // dispatcher, CP comm type
  // A PeakMemoryFunction may stop at the first pp rank whose total exceeds this (0: it sizes every rank):
  // the estimate is then that rank's, a lower bound of the peak, with `complete` false.
  std::int64_t stop_above_bytes = 0;
};

struct MemoryItem {
  std::string name;
  std::int64_t bytes = 0;
  std::string detail;  // how it was counted
};

struct MemoryEstimate {
  int pp_rank = 0;
  std::int64_t parameters = 0;        // local parameter elements (dense + expert)
  std::int64_t weight_bytes = 0;      // bf16 params
  std::int64_t gradient_bytes = 0;    // fp32 main grads (DDP grad buffer)
  std::int64_t optimizer_bytes = 0;   // fp32 master params + Adam m, v (sharded with dist-opt)
  std::int64_t activation_bytes = 0;  // saved activations of in-flight microbatches (logits excluded)
  std::int64_t logits_bytes = 0;      // logits (+ fp32 copy) of in-flight microbatches on the loss stage
  std::int64_t transient_bytes = 0;   // working set of the op running at the peak (recompute, gathers)
  std::int64_t buffer_bytes = 0;      // p2p, NCCL, cuBLAS workspace, CUDA context
  std::int64_t fragmentation_bytes = 0;
  std::int64_t total_bytes = 0;
  std::vector<int> in_flight_per_chunk;  // microbatches whose activations a chunk holds at the peak
  std::vector<MemoryItem> items;
  bool complete = true;  // false: the ranks after pp_rank were not sized (MemoryOptions::stop_above_bytes)
  // Aligned text, one item per line, with the total.
  std::string itemize() const;
};

// Activation bytes one decoder layer saves for one microbatch (megatron.md §5 generalized to GQA, SwiGLU,
// MoE, CP and SP); under full recomputation those of a unit of one layer (its input). estimate_memory sums
// them per the chunk's recompute plan: kept layers all they save, each unit its input once, plus the
// largest unit's full activations as the working set of its re-run.
std::int64_t layer_activation_bytes(const layouts::ModelSpec& model, const layouts::RankShape& shape,
                                    bool moe, const MemoryOptions& options);

// Microbatches in flight per chunk at a pp rank's peak: the forwards Megatron runs before the first
// backward (warm-up + 1), distributed over chunks by the interleaved table.
std::vector<int> in_flight_microbatches_per_chunk(const layouts::ParallelConfig& config, int vpp,
                                                  int pp_rank);

// The device memory every pp rank holds outside its tensors: CUDA context, cuBLAS workspace, one NCCL buffer
// per communicator of more than one rank, and the p2p buffers under pipelining.
MemoryItem device_buffers(const layouts::RankShape& shape, const MemoryOptions& options);

MemoryEstimate estimate_memory(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                               int pp_rank, const MemoryOptions& options = {});
// The rank with the largest total.
MemoryEstimate peak_memory(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                           const MemoryOptions& options = {});

// Which model judges whether a layout fits: the executor's own arena (megatune trains the plan; its sizing
// pass, injected by the caller because the planner may not depend on the executor) or Megatron-LM's
// (the peak_memory above, for plans run with Megatron).
enum class MemoryModelKind { kMegatune, kMegatron };
const char* memory_model_name(MemoryModelKind kind);  // "megatune" / "megatron"
// The peak of a (model, layout) over its pipeline ranks, by some memory model; thread-safe.
using PeakMemoryFunction = std::function<MemoryEstimate(
    const layouts::ModelSpec&, const layouts::ParallelConfig&, const MemoryOptions&)>;

std::string format_bytes(double bytes);  // "12.3 GiB"

}  // namespace megatune::planner
