// plan and simulate's communication-pricing flags.
#include "tools/comm_pricing_flags.h"

#include "base/user_error.h"

namespace megatune::tools {

void add_comm_pricing_flags(CLI::App& command, CommPricingFlags& flags, const std::string& group) {
  command
      .add_flag(
          "--tp-comm-overlap", flags.tp_comm_overlap,
          "Overlap TP all-gathers/reduce-scatters with their GEMMs in chunks (needs --sequence-parallel)")
      ->group(group);
  CLI::Option* bf16_grads =
      command
          .add_flag("--grad-reduce-in-bf16", flags.grad_reduce_in_bf16,
                    "Reduce gradients in bf16 (bf16 grad buffers; default: fp32 for bf16 training)")
          ->group(group);
  command
      .add_flag("--accumulate-allreduce-grads-in-fp32", flags.accumulate_allreduce_grads_in_fp32,
                "Accumulate and reduce gradients in fp32 (Megatron's default for bf16 training)")
      ->excludes(bf16_grads)
      ->group(group);
}

void check_tp_comm_overlap(const CommPricingFlags& flags, const layouts::ParallelConfig& config) {
  if (flags.tp_comm_overlap && !config.sequence_parallel_enabled()) {
    throw UserError(
        "--tp-comm-overlap overlaps the all-gathers and reduce-scatters of sequence parallelism: "
        "add --sequence-parallel with --tp > 1, or drop --tp-comm-overlap");
  }
}

std::vector<std::string> megatron_comm_arguments(const CommPricingFlags& flags,
                                                 const layouts::ParallelConfig& config) {
  std::vector<std::string> args;
  if (flags.tp_comm_overlap && config.sequence_parallel_enabled()) args.push_back("--tp-comm-overlap");
  if (flags.grad_reduce_in_bf16) args.push_back("--grad-reduce-in-bf16");
  if (flags.accumulate_allreduce_grads_in_fp32) args.push_back("--accumulate-allreduce-grads-in-fp32");
  return args;
}

}  // namespace megatune::tools
