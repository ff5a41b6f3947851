// Fit check of a layout against free device memory, with the planner's nearest fitting alternatives.
#include "planner/memory_fit.h"

#include <sstream>

#include "base/user_error.h"

namespace megatune::planner {
namespace {

using layouts::ParallelConfig;
using layouts::RecomputeGranularity;

bool fits(const layouts::ModelSpec& model, const ParallelConfig& config, std::int64_t free_bytes,
          const MemoryOptions& options) {
  try {
    config.validate(model);
    return peak_memory(model, config, options).total_bytes <= free_bytes;
  } catch (const std::exception&) {
    return false;
  }
}

ParallelConfig with_full_recompute(ParallelConfig config) {
  config.recompute_granularity = RecomputeGranularity::kFull;
  config.recompute_method = layouts::RecomputeMethod::kUniform;
  config.recompute_num_layers = 1;
  return config;
}

// The same layout with the memory savers a user can switch on without more GPUs, cheapest first.
std::string same_gpus_advice(const ParallelConfig& config, const LayoutFits& fits) {
  struct Variant {
    ParallelConfig config;
    std::string flags;
  };
  std::vector<Variant> variants;
  if (config.recompute_granularity == RecomputeGranularity::kNone) {
    ParallelConfig selective = config;
    selective.recompute_granularity = RecomputeGranularity::kSelective;
    variants.push_back({selective, "--recompute-granularity selective"});
  }
  if (config.recompute_granularity != RecomputeGranularity::kFull)
    variants.push_back(
        {with_full_recompute(config), "--recompute-granularity full --recompute-method uniform"});
  ParallelConfig small = with_full_recompute(config);
  if (config.micro_batch_size > 1) {
    small.micro_batch_size = 1;
    variants.push_back({small, "--recompute-granularity full --micro-batch-size 1"});
  }
  if (config.dp() * config.cp() > 1 && !config.use_distributed_optimizer) {
    small.use_distributed_optimizer = true;
    variants.push_back(
        {small, "--recompute-granularity full --micro-batch-size 1 --use-distributed-optimizer"});
  }
  for (const Variant& variant : variants) {
    if (fits(variant.config)) return "it fits with " + variant.flags;
  }
  return "";
}

// The fewest GPUs (powers of two up to 1024) on which some tp x pp split with full recomputation and
// micro-batch 1 fits.
std::string more_gpus_advice(const layouts::ModelSpec& model, const ParallelConfig& config,
                             std::int64_t free_bytes, const MemoryOptions& options) {
  for (int world = config.world_size * 2; world <= 1024; world *= 2) {
    for (int tp = 1; tp <= std::min(world, 8); tp *= 2) {
      for (int pp = 1; tp * pp <= world; pp *= 2) {
        ParallelConfig candidate = with_full_recompute(ParallelConfig{});
        candidate.world_size = world;
        candidate.tensor_model_parallel_size = tp;
        candidate.pipeline_model_parallel_size = pp;
        candidate.sequence_parallel = tp > 1;
        candidate.use_distributed_optimizer = world / (tp * pp) > 1;
        candidate.micro_batch_size = 1;
        candidate.global_batch_size = std::max(config.resolved_global_batch_size(), world / (tp * pp));
        if (!fits(model, candidate, free_bytes, options)) continue;
        std::ostringstream out;
        out << "on " << world << " GPUs with --tp " << tp << " --pp " << pp
            << (candidate.sequence_parallel ? " --sequence-parallel" : "")
            << (candidate.use_distributed_optimizer ? " --use-distributed-optimizer" : "")
            << " --recompute-granularity full (megatune plan finds the fastest layout)";
        return out.str();
      }
    }
  }
  return "";
}

}  // namespace

std::string fitting_alternatives(const layouts::ModelSpec& model, const ParallelConfig& config,
                                 std::int64_t free_bytes, const MemoryOptions& options) {
  return fitting_alternatives(
      model, config, free_bytes,
      [&](const ParallelConfig& variant) { return fits(model, variant, free_bytes, options); }, options);
}

std::string fitting_alternatives(const layouts::ModelSpec& model, const ParallelConfig& config,
                                 std::int64_t free_bytes, const LayoutFits& same_gpus_fit,
                                 const MemoryOptions& options) {
  const std::string same = same_gpus_advice(config, same_gpus_fit);
  const std::string more = more_gpus_advice(model, config, free_bytes, options);
  if (!same.empty() && !more.empty()) return same + ", or " + more;
  if (!same.empty()) return same;
  if (!more.empty()) return "it fits " + more;
  return "no layout within 1024 GPUs fits: use a smaller model or --seq-length";
}

void require_fits_in_memory(const layouts::ModelSpec& model, const ParallelConfig& config,
                            std::int64_t free_bytes, std::int64_t total_bytes, const MemoryOptions& options) {
  const MemoryEstimate need = peak_memory(model, config, options);
  if (need.total_bytes <= free_bytes) return;
  std::ostringstream out;
  out << model.name << " (tp" << config.tp() << " pp" << config.pp() << " dp" << config.dp() << ", mbs "
      << config.micro_batch_size << ", recompute " << layouts::to_string(config.recompute_granularity)
      << ") needs about " << format_bytes(static_cast<double>(need.total_bytes)) << " per GPU (weights "
      << format_bytes(static_cast<double>(need.weight_bytes)) << ", gradients "
      << format_bytes(static_cast<double>(need.gradient_bytes)) << ", optimizer "
      << format_bytes(static_cast<double>(need.optimizer_bytes)) << ", activations "
      << format_bytes(static_cast<double>(need.activation_bytes + need.logits_bytes)) << ") but the GPU has "
      << format_bytes(static_cast<double>(free_bytes)) << " free";
  if (total_bytes > 0) out << " of " << format_bytes(static_cast<double>(total_bytes));
  out << ": " << fitting_alternatives(model, config, free_bytes, options);
  throw UserError(out.str());
}

}  // namespace megatune::planner
