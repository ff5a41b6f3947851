// The flags that change how plan and simulate price a layout's communication and gradient buffers, as
// Megatron-LM spells them: --tp-comm-overlap, --grad-reduce-in-bf16, --accumulate-allreduce-grads-in-fp32.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "layouts/parallel_config.h"

namespace megatune::tools {

struct CommPricingFlags {
  // Gradient buffers and their reduction: fp32 (Megatron's default for bf16 training, also set by
  // --accumulate-allreduce-grads-in-fp32) or bf16 (--grad-reduce-in-bf16).
  bool grad_reduce_in_bf16 = false;
  bool accumulate_allreduce_grads_in_fp32 = false;
  bool tp_comm_overlap = false;  // --tp-comm-overlap (needs sequence parallelism)
};

void add_comm_pricing_flags(CLI::App& command, CommPricingFlags& flags, const std::string& group);
// --tp-comm-overlap on a layout without sequence parallelism: one line naming the fix.
void check_tp_comm_overlap(const CommPricingFlags& flags, const layouts::ParallelConfig& config);
// The flags as Megatron-LM's command line takes them for `config` (appended to a plan's pretrain_gpt.py
// arguments): --tp-comm-overlap only where sequence parallelism is on, as Megatron runs it.
std::vector<std::string> megatron_comm_arguments(const CommPricingFlags& flags,
                                                 const layouts::ParallelConfig& config);

}  // namespace megatune::tools
