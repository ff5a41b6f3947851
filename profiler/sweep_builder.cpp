// Sweep generation from step programs and generic grids.
#include "profiler/sweep_builder.h"

#include <set>
#include <sstream>
#include <string>

#include "base/user_error.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::profiler {
namespace {

using layouts::OpKind;

std::string key_string(const cost_models::KernelTiming& r) {
  std::ostringstream out;
  out << r.op_kind << '|' << r.m << '|' << r.n << '|' << r.k << '|' << r.batch << '|' << r.heads << '|'
      << r.kv_heads << '|' << r.seq_q << '|' << r.seq_kv << '|' << r.head_dim << '|' << r.causal << '|'
      << r.bytes << '|' << r.dtype;
  return out.str();
}

std::string key_string(const cost_models::CollectiveTiming& r) {
  std::ostringstream out;
  out << r.op << '|' << r.group_size << '|' << r.placement << '|' << r.nodes << '|' << r.bytes;
  return out.str();
}

// Deduplicating appender.
class SweepCollector {
 public:
  explicit SweepCollector(Sweep& sweep) : sweep_(sweep) {
    for (const auto& item : sweep.gemms) seen_.insert(key_string(kernel_timing_key(item)));
    for (const auto& item : sweep.attention) seen_.insert(key_string(kernel_timing_key(item)));
    for (const auto& item : sweep.memory_bound) seen_.insert(key_string(kernel_timing_key(item)));
    for (const auto& item : sweep.collectives) seen_.insert(key_string(collective_timing_key(item)));
  }
  void add(const GemmItem& item) {
    if (seen_.insert(key_string(kernel_timing_key(item))).second) sweep_.gemms.push_back(item);
  }
  void add(const AttentionItem& item) {
    if (seen_.insert(key_string(kernel_timing_key(item))).second) sweep_.attention.push_back(item);
  }
  void add(const MemoryBoundItem& item) {
    if (seen_.insert(key_string(kernel_timing_key(item))).second) sweep_.memory_bound.push_back(item);
  }
  void add(const CollectiveItem& item) {
    if (seen_.insert(key_string(collective_timing_key(item))).second) sweep_.collectives.push_back(item);
  }

 private:
  Sweep& sweep_;
  std::set<std::string> seen_;
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_label(const std::string& label) {
  for (const char* suffix : {"_dgrad", "_wgrad"}) {
    if (ends_with(label, suffix)) return label.substr(0, label.size() - std::string(suffix).size());
  }
  return label;
}

// The executor's GEMM for a step-program GEMM op (see GemmVariant): variant from the label suffix, fused
// epilogue from the model (bias on every forward linear with add_bias_linear; GELU fused into fc1's
// forward and into fc2's data gradient).
GemmItem gemm_item_of(const layouts::Op& op, const layouts::ModelSpec& model) {
  GemmItem item;
  item.m = op.m, item.n = op.n, item.k = op.k;
  item.dtype = op.dtype;
  const bool gelu = model.activation == layouts::Activation::kGelu;
  const std::string base = base_label(op.label);
  const bool mlp_in = base == "fc1" || base == "expert_fc1" || base == "shared_fc1";
  const bool mlp_out = base == "fc2" || base == "expert_fc2" || base == "shared_fc2";
  if (ends_with(op.label, "_wgrad") || op.accumulate) {
    item.variant = GemmVariant::kBackwardWeight;
  } else if (ends_with(op.label, "_dgrad")) {
    item.variant = GemmVariant::kBackwardData;
    if (gelu && mlp_out) item.fusion = GemmFusion::kDGeluBiasGrad;
  } else {
    item.variant = GemmVariant::kForward;
    const bool bias = model.add_bias_linear && base != "logits" && base != "router";
    if (gelu && mlp_in) {
      item.fusion = bias ? GemmFusion::kGeluAuxBias : GemmFusion::kGeluAux;
    } else if (bias) {
      item.fusion = GemmFusion::kBias;
    }
  }
  return item;
}

std::int64_t columns_of(const layouts::Op& op, const layouts::RankShape& s) {
  switch (op.kind) {
    case OpKind::kActivation:
    case OpKind::kActivationBackward:
      return op.label.rfind("expert", 0) == 0   ? s.moe_ffn_per_rank()
             : op.label.rfind("shared", 0) == 0 ? s.shared_ffn_per_rank()
                                                : s.ffn_per_rank();
    case OpKind::kRope:
    case OpKind::kRopeBackward:
      return s.head_dim;
    case OpKind::kCrossEntropy:
      return s.vocab_per_rank();
    case OpKind::kOptimizer:
    case OpKind::kGradNorm:
      return 0;
    default:
      return s.hidden;
  }
}

// An FP8 cast's copies and scaling, from the label its linear gives it (layouts/step_program.cpp): the
// weight and the output gradient are cast with their transposes, the input once, and again transposed for
// the weight gradient, always from its own amax.
void set_fp8_cast(const layouts::Op& op, const layouts::Fp8Settings& fp8, MemoryBoundItem& item) {
  item.dtype = layouts::DType::kFP8;
  const bool transposed_input = ends_with(op.label, "_input_fp8t");
  item.cast_outputs = ends_with(op.label, "_weight_fp8") || ends_with(op.label, "_grad_fp8") ? 2 : 1;
  item.cast_current_scaling = transposed_input || fp8.recipe == layouts::Fp8Recipe::kTensorwise;
}

void add_program_ops(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                     const layouts::Fp8Settings& fp8, SweepCollector& collector, ModelSweepReport& report) {
  const layouts::RankShape shape = layouts::resolve_rank_shape(model, config);
  layouts::StepProgramOptions options;
  options.fp8 = fp8;
  const layouts::StepProgram program = layouts::build_step_program(model, config, 0, options);
  for (const layouts::Op& op : program.ops) {
    if (op.is_communication()) continue;  // collectives: measured over sizes (collective_sweep)
    if (op.kind == OpKind::kGemm) {
      collector.add(gemm_item_of(op, model));
    } else if (op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) {
      if (op.attention.seq_q != op.attention.seq_kv) {
        ++report.cross_attention_skipped;
        continue;
      }
      AttentionItem item;
      item.backward = op.kind == OpKind::kAttentionBackward;
      item.shape = op.attention;
      item.dtype = op.dtype;
      collector.add(item);
    } else if (op.bytes > 0) {
      MemoryBoundItem item;
      item.kind = op.kind;
      item.bytes = op.bytes;
      item.columns = columns_of(op, shape);
      item.swiglu = shape.swiglu;
      item.rms_norm = shape.rms;
      if (op.kind == OpKind::kElementwise && op.dtype == layouts::DType::kFP8) set_fp8_cast(op, fp8, item);
      collector.add(item);
    }
  }
}

}  // namespace

Sweep model_sweep(const layouts::ModelSpec& model, const SweepCandidates& candidates,
                  ModelSweepReport* report) {
  Sweep sweep;
  SweepCollector collector(sweep);
  ModelSweepReport local;
  const std::vector<int> ep_values = model.is_moe() ? candidates.expert_parallel : std::vector<int>{1};
  for (const int tp : candidates.tensor_parallel) {
    for (const int cp : candidates.context_parallel) {
      for (const int ep : ep_values) {
        for (const int mbs : candidates.micro_batch) {
          std::vector<bool> sp_values = {false};
          if (tp > 1 && candidates.sequence_parallel_variants) sp_values.push_back(true);
          for (const bool sp : sp_values) {
            layouts::ParallelConfig config;
            config.tensor_model_parallel_size = tp;
            config.context_parallel_size = cp;
            config.expert_model_parallel_size = ep;
            config.world_size = tp * cp * ep;  // dp = ep
            config.micro_batch_size = mbs;
            config.sequence_parallel = sp || (model.is_moe() && ep > 1 && tp > 1);
            try {
              config.validate(model);
            } catch (const UserError&) {
              ++local.layouts_invalid;
              continue;
            }
            if (candidates.fp8.enabled() &&
                !layouts::fp8_shape_problem(layouts::resolve_rank_shape(model, config)).empty()) {
              ++local.layouts_invalid;  // train refuses FP8 GEMMs of these shapes
              continue;
            }
            add_program_ops(model, config, candidates.fp8, collector, local);
            ++local.layouts_expanded;
          }
        }
      }
    }
  }
  if (report != nullptr) *report = local;
  return sweep;
}

Sweep generic_kernel_grid(bool quick) {
  Sweep sweep;
  SweepCollector collector(sweep);
  const std::vector<std::int64_t> dims =
      quick ? std::vector<std::int64_t>{512, 2048, 8192}
            : std::vector<std::int64_t>{256, 512, 1024, 2048, 4096, 8192, 16384};
  for (const std::int64_t m : dims) {
    for (const std::int64_t n : dims) {
      for (const std::int64_t k : dims) {
        GemmItem item;
        item.m = m, item.n = n, item.k = k;
        collector.add(item);
      }
    }
  }
  struct Heads {
    std::int64_t batch, heads, kv_heads;
  };
  std::vector<Heads> head_configs = {{2, 32, 8}, {1, 16, 16}};
  if (!quick) head_configs.push_back({4, 32, 4});
  for (const std::int64_t head_dim : {64, 128}) {
    for (const std::int64_t seq : {512, 1024, 2048, 4096, 8192}) {
      for (const Heads& h : head_configs) {
        for (const bool backward : {false, true}) {
          AttentionItem item;
          item.backward = backward;
          item.shape = {h.batch, h.heads, h.kv_heads, seq, seq, head_dim, true};
          collector.add(item);
        }
      }
    }
  }
  const std::vector<std::int64_t> mib =
      quick ? std::vector<std::int64_t>{1, 8, 64, 512} : std::vector<std::int64_t>{1, 4, 16, 64, 256, 1024};
  struct Kind {
    OpKind kind;
    std::int64_t columns;
  };
  const Kind kinds[] = {{OpKind::kNorm, 4096},        {OpKind::kNormBackward, 4096},
                        {OpKind::kActivation, 14336}, {OpKind::kActivationBackward, 14336},
                        {OpKind::kElementwise, 4096}, {OpKind::kRope, 128},
                        {OpKind::kRopeBackward, 128}, {OpKind::kCrossEntropy, 128256},
                        {OpKind::kOptimizer, 0},      {OpKind::kGradNorm, 0}};
  for (const Kind& kind : kinds) {
    for (const std::int64_t size : mib) {
      MemoryBoundItem item;
      item.kind = kind.kind;
      item.bytes = size << 20;
      item.columns = kind.columns;
      item.swiglu = true;
      item.rms_norm = true;
      collector.add(item);
    }
  }
  return sweep;
}

std::vector<CollectiveItem> collective_sweep(int gpus, bool quick, std::int64_t min_bytes,
                                             std::int64_t max_bytes) {
  std::vector<CollectiveItem> items;
  if (gpus < 2 || min_bytes <= 0) return items;
  const std::int64_t step = quick ? 4 : 2;
  for (const cost_models::CollectiveOp op :
       {cost_models::CollectiveOp::kAllReduce, cost_models::CollectiveOp::kAllGather,
        cost_models::CollectiveOp::kReduceScatter, cost_models::CollectiveOp::kAllToAll,
        cost_models::CollectiveOp::kSendRecv, cost_models::CollectiveOp::kBroadcast}) {
    for (int group_size = 2; group_size <= gpus; ++group_size) {
      for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= step) {
        items.push_back({op, group_size, bytes});
      }
    }
  }
  return items;
}

void merge_sweep(Sweep& into, const Sweep& from) {
  SweepCollector collector(into);
  for (const auto& item : from.gemms) collector.add(item);
  for (const auto& item : from.attention) collector.add(item);
  for (const auto& item : from.memory_bound) collector.add(item);
  for (const auto& item : from.collectives) collector.add(item);
}

}  // namespace megatune::profiler
