// Plan candidates: pinned-knob checks, enumeration of (tp, cp, pp, dp) grids, pipeline arrangements, expert
// layouts, micro-batch, recomputation, optimizer sharding and SP; validation; the nothing-fits error.
#include "planner/search_candidates.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "base/user_error.h"
#include "layouts/fp8.h"
#include "layouts/pipeline_layout.h"
#include "layouts/rank_shape.h"
#include "planner/layout_choices.h"

namespace megatune::planner {

using layouts::ParallelConfig;
using layouts::PipelineLayout;
using layouts::RecomputeGranularity;

namespace {

std::vector<int> powers_of_two_up_to(int limit) {
  std::vector<int> out;
  for (int v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

std::vector<int> divisors(int n, int limit) {
  std::vector<int> out;
  for (int d = 1; d <= n && d <= limit; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// "1, 2, 4 or 8": the values of `candidates` that pass `fits`, for advice naming what would work.
std::string list_of(const std::vector<int>& candidates) {
  std::string text;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == candidates.size() ? " or " : ", ") + std::to_string(candidates[i]);
  }
  return text;
}

std::vector<int> divisors_of_both(int a, int b) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(a, b); ++d)
    if (a % d == 0 && b % d == 0) out.push_back(d);
  return out;
}

// Megatron's split flags against the other ways of giving the pipeline layout, as Megatron refuses them.
void check_pinned_split(const SearchSpace& space) {
  const bool uneven = space.first_stage_layers >= 0 || space.last_stage_layers >= 0;
  const bool accounting = space.account_for_embedding || space.account_for_loss;
  if (!uneven && !accounting) return;
  if (!space.pipeline_layout.empty())
    throw UserError(
        "--pipeline-model-parallel-layout already places every layer: drop "
        "--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split");
  if (uneven && accounting)
    throw UserError(
        "--decoder-first/last-pipeline-num-layers cannot be combined with "
        "--account-for-embedding/loss-in-pipeline-split: use one of them");
  if (space.layers_per_virtual_stage > 0)
    throw UserError(
        "--num-layers-per-virtual-pipeline-stage does not fit a split with lighter first/last stages: give "
        "--num-virtual-stages-per-pipeline-rank instead");
}

void check_knobs(const layouts::ModelSpec& model, int world, int global_batch_size,
                 const SearchSpace& space) {
  for (int tp : space.tp) {
    if (tp < 1) throw UserError("--tensor-model-parallel-size " + std::to_string(tp) + " must be at least 1");
    if (world % tp != 0) {
      throw UserError("--tensor-model-parallel-size " + std::to_string(tp) + " does not divide the " +
                      std::to_string(world) + " GPUs of --cluster; use --tp " +
                      list_of(divisors_of_both(world, model.num_attention_heads)));
    }
    if (model.num_attention_heads % tp != 0) {
      throw UserError("--tensor-model-parallel-size " + std::to_string(tp) + " does not divide the " +
                      std::to_string(model.num_attention_heads) + " attention heads of " + model.name +
                      "; use --tp " + list_of(divisors_of_both(world, model.num_attention_heads)));
    }
  }
  for (int pp : space.pp) {
    if (pp < 1)
      throw UserError("--pipeline-model-parallel-size " + std::to_string(pp) + " must be at least 1");
    if (world % pp != 0 || pp > model.num_layers) {
      throw UserError("--pipeline-model-parallel-size " + std::to_string(pp) +
                      (world % pp != 0
                           ? " does not divide the " + std::to_string(world) + " GPUs of --cluster"
                           : " exceeds the " + std::to_string(model.num_layers) + " layers") +
                      "; use --pp " + list_of(divisors_of_both(world, world)) + " (at most " +
                      std::to_string(model.num_layers) + ")");
    }
  }
  for (int cp : space.cp) {
    if (cp < 1) throw UserError("--context-parallel-size " + std::to_string(cp) + " must be at least 1");
    if (world % cp != 0 || model.seq_length % (2 * cp) != 0) {
      throw UserError("--context-parallel-size " + std::to_string(cp) +
                      (world % cp != 0
                           ? " does not divide the " + std::to_string(world) + " GPUs of --cluster"
                           : ": 2 x cp must divide --seq-length " + std::to_string(model.seq_length)) +
                      "; use --cp " + list_of(divisors_of_both(world, std::max(1, model.seq_length / 2))));
    }
  }
  for (int ep : space.ep) {
    if (ep < 1) throw UserError("--expert-model-parallel-size " + std::to_string(ep) + " must be at least 1");
    if (model.is_moe() && (model.num_experts % ep != 0 || world % ep != 0)) {
      throw UserError("--expert-model-parallel-size " + std::to_string(ep) + " must divide the " +
                      std::to_string(model.num_experts) + " experts and the " + std::to_string(world) +
                      " GPUs; use --ep " + list_of(divisors_of_both(world, model.num_experts)));
    }
  }
  if (space.dp < 0)
    throw UserError("--data-parallel-size " + std::to_string(space.dp) + " must be at least 1");
  if (space.dp > 0 && (world % space.dp != 0 || global_batch_size % space.dp != 0)) {
    throw UserError("--data-parallel-size " + std::to_string(space.dp) +
                    (world % space.dp != 0
                         ? " does not divide the " + std::to_string(world) + " GPUs of --cluster"
                         : " does not divide --global-batch-size " + std::to_string(global_batch_size)) +
                    "; use --dp " + list_of(divisors_of_both(world, global_batch_size)));
  }
  check_pinned_split(space);
  for (int mbs : space.micro_batch) {
    if (mbs < 1) throw UserError("--micro-batch-size " + std::to_string(mbs) + " must be at least 1");
    if (global_batch_size % mbs != 0) {
      throw UserError("--micro-batch-size " + std::to_string(mbs) + " does not divide --global-batch-size " +
                      std::to_string(global_batch_size) + "; use --mbs " +
                      list_of(divisors_of_both(global_batch_size, std::min(global_batch_size, 64))));
    }
  }
}

// A (tp, cp, pp) grid of the world and its data-parallel size.
struct Grid {
  int tp = 1, cp = 1, pp = 1, dp = 1;
};

std::vector<Grid> grids(const PlanRequest& request, int gpus_per_node) {
  const layouts::ModelSpec& model = request.model;
  const SearchSpace& space = request.space;
  const int world = request.world_size;
  const std::vector<int> tps =
      !space.tp.empty() ? space.tp : powers_of_two_up_to(space.allow_tp_across_nodes ? world : gpus_per_node);
  const std::vector<int> cps = !space.cp.empty() ? space.cp : powers_of_two_up_to(world);
  std::vector<Grid> out;
  for (int tp : tps) {
    if (tp > world || world % tp != 0 || model.num_attention_heads % tp != 0) continue;
    for (int cp : cps) {
      if (world % (tp * cp) != 0 || model.seq_length % (2 * cp) != 0) continue;
      if (cp > 1 && model.seq_length / cp < 512) continue;  // too short a chunk to be worth a ring
      const std::vector<int> pps =
          !space.pp.empty() ? space.pp : divisors(world / (tp * cp), model.num_layers);
      for (int pp : pps) {
        if (world % (tp * cp * pp) != 0) continue;
        const int dp = world / (tp * cp * pp);
        if (request.global_batch_size % dp != 0 || (space.dp > 0 && dp != space.dp)) continue;
        out.push_back({tp, cp, pp, dp});
      }
    }
  }
  return out;
}

// (ep, etp) pairs of a MoE model on the grid; {1, 0} (etp = tp) for a dense one.
std::vector<std::pair<int, int>> expert_layouts(const PlanRequest& request, const Grid& grid) {
  const layouts::ModelSpec& model = request.model;
  const SearchSpace& space = request.space;
  if (!model.is_moe()) return {{1, 0}};
  std::vector<std::pair<int, int>> experts;
  const std::vector<int> eps = !space.ep.empty() ? space.ep : divisors(model.num_experts, model.num_experts);
  for (int ep : eps) {
    std::vector<int> etps = !space.etp.empty() ? space.etp : std::vector<int>{1, grid.tp};
    std::sort(etps.begin(), etps.end());
    etps.erase(std::unique(etps.begin(), etps.end()), etps.end());
    for (int etp : etps)
      if ((request.world_size / grid.pp) % (ep * etp) == 0) experts.push_back({ep, etp});
  }
  return experts;
}

// The per-candidate knobs beyond the grid and the pipeline arrangement.
struct Knobs {
  int ep = 1, etp = 0, mbs = 1;
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  bool dopt = false, sp = false;
  std::optional<layouts::DataParallelSharding> fsdp;  // Megatron FSDP with this strategy
  // Full recomputation's unit rule (kNone: the search space's).
  layouts::RecomputeMethod recompute_method = layouts::RecomputeMethod::kNone;
  int recompute_num_layers = 0;
};

// Block units tried beside uniform 1 for a layout whose chunks hold `chunk_layers` decoder layers: 1/2 and
// then 1/4 of a chunk (recomputing fewer layers than uniform 1: faster, and more memory: block N needs more
// than uniform 1 and than block 2N, so each is tried only where the one before fits). None when pinned.
std::vector<int> block_recompute_layers(const SearchSpace& space, int chunk_layers) {
  std::vector<int> out;
  if (space.recompute_pinned) return out;
  for (int n : {chunk_layers / 2, chunk_layers / 4})
    if (n >= 1 && n < chunk_layers && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

// One choice of the data-parallel sharding dimension: DDP, the distributed optimizer, or an FSDP strategy.
struct ShardingChoice {
  bool dopt = false;
  std::optional<layouts::DataParallelSharding> fsdp;
};

LayoutCandidate make_candidate(const PlanRequest& request, const Grid& grid, const LayoutChoice& layout,
                               const Knobs& k) {
  const SearchSpace& space = request.space;
  LayoutCandidate c;
  ParallelConfig& cfg = c.config;
  cfg.world_size = request.world_size;
  cfg.tensor_model_parallel_size = grid.tp;
  cfg.context_parallel_size = grid.cp;
  cfg.pipeline_model_parallel_size = grid.pp;
  cfg.expert_model_parallel_size = k.ep;
  cfg.expert_tensor_parallel_size = k.etp;
  cfg.micro_batch_size = k.mbs;
  cfg.global_batch_size = request.global_batch_size;
  cfg.sequence_parallel = k.sp;
  cfg.recompute_granularity = k.recompute;
  if (k.recompute == RecomputeGranularity::kFull) {
    const bool given = k.recompute_method != layouts::RecomputeMethod::kNone;
    cfg.recompute_method = given ? k.recompute_method : space.recompute_method;
    cfg.recompute_num_layers = given ? k.recompute_num_layers : space.recompute_num_layers;
  }
  cfg.moe_token_dispatcher_type = space.moe_dispatcher;
  cfg.rank_order = space.rank_order;
  if (layout.vpp > 1) cfg.microbatch_group_size_per_vp_stage = space.microbatch_group_size;
  cfg.use_distributed_optimizer = k.dopt;
  if (k.fsdp) {
    cfg.use_megatron_fsdp = true;
    cfg.data_parallel_sharding_strategy = *k.fsdp;
  }
  const bool replicated = grid.dp * grid.cp > 1;
  cfg.overlap_grad_reduce = replicated;
  cfg.overlap_param_gather = cfg.shards_optimizer_state() && replicated;
  if (layout.vpp > 1 && grid.pp == 2) cfg.overlap_p2p_comm = true;
  layout.apply(request.model, cfg);
  c.stages = layout.stages;
  c.vpp = layout.vpp;
  return c;
}

// Validates a candidate and, with Megatron's closed-form memory model, checks that it fits.
class CandidateFilter {
 public:
  CandidateFilter(const PlanRequest& request, double capacity, PlanStatistics& stats, CandidateSet& out)
      : request_(request), capacity_(capacity), stats_(stats), out_(out) {
    memory_options_ = request.memory;
    memory_options_.step = request.step;
  }

  // `count` candidates a rule of validate() refuses, skipped unbuilt; the first one is built and validated
  // for its message.
  void refuse(std::int64_t count, const std::function<LayoutCandidate()>& make) {
    if (count <= 0) return;
    if (stats_.invalid == 0) {
      add(make());
      --count;
    }
    stats_.enumerated += count;
    stats_.invalid += count;
  }

  // Whether the candidate was kept: valid and, as far as known here, fitting (an injected memory model sizes
  // only the candidates it would simulate: those are kept).
  bool add(LayoutCandidate c) {
    ++stats_.enumerated;
    try {
      c.config.validate(request_.model, c.stages.get());
      const std::string fp8 =
          request_.step.fp8.enabled()
              ? layouts::fp8_shape_problem(layouts::resolve_rank_shape(request_.model, c.config))
              : "";
      if (!fp8.empty()) throw UserError("--fp8-format: " + fp8 + ", FP8 GEMMs need multiples of 16");
    } catch (const std::exception& e) {
      if (stats_.invalid++ == 0) out_.first_invalid = describe(c) + ": " + e.what();
      return false;
    }
    if (!request_.peak_memory_of) {
      const MemoryEstimate peak = peak_memory(request_.model, c.config, memory_options_);
      c.peak_memory_bytes = peak.total_bytes;
      c.peak_memory_pp_rank = peak.pp_rank;
      if (peak.total_bytes > capacity_) {
        ++stats_.out_of_memory;
        out_.smallest_oom.note(peak.total_bytes, c);
        return false;
      }
    }
    out_.candidates.push_back(std::move(c));
    return true;
  }
  // Whether add() learns if a candidate fits (Megatron's closed-form model), so that heavier recomputation
  // can be tried only where the lighter does not fit.
  bool sizes_at_enumeration() const { return !request_.peak_memory_of; }

 private:
  const PlanRequest& request_;
  double capacity_;
  PlanStatistics& stats_;
  CandidateSet& out_;
  MemoryOptions memory_options_;
};

// The candidates of one grid. Two rules of validate() are applied before a candidate is built, as they
// refuse most of a large MoE space: the interleaved schedule needs at least pp microbatches, and expert
// parallelism under tensor parallelism needs SP.
void enumerate_grid(const PlanRequest& request, const Grid& grid, CandidateFilter& filter) {
  const SearchSpace& space = request.space;
  const std::vector<int> mbss = !space.micro_batch.empty() ? space.micro_batch : std::vector<int>{1, 2, 4, 8};
  // Sharding does nothing without data parallelism; SP nothing without TP.
  std::vector<ShardingChoice> shardings;
  if (grid.dp * grid.cp == 1) {
    shardings.push_back(
        {space.distributed_optimizer.empty() ? false : space.distributed_optimizer.front(), {}});
  } else {
    for (bool dopt : space.distributed_optimizer) shardings.push_back({dopt, {}});
    for (layouts::DataParallelSharding s : space.fsdp) shardings.push_back({false, s});
  }
  const std::vector<bool> sps = grid.tp == 1 ? std::vector<bool>{false} : space.sequence_parallel;
  const std::vector<std::pair<int, int>> experts = expert_layouts(request, grid);
  const auto count = [&](std::size_t n) {
    return static_cast<std::int64_t>(n * space.recompute.size() * shardings.size());
  };
  for (const LayoutChoice& layout : layout_choices(request.model, grid.pp, space))
    for (auto [ep, etp] : experts)
      for (int mbs : mbss) {
        if ((request.global_batch_size / grid.dp) % mbs != 0) continue;
        auto make = [&](RecomputeGranularity rc, const ShardingChoice& d, bool sp) {
          return make_candidate(request, grid, layout, {ep, etp, mbs, rc, d.dopt, sp, d.fsdp});
        };
        if (layout.vpp > 1 && request.global_batch_size / (grid.dp * mbs) < grid.pp) {
          filter.refuse(count(sps.size()),
                        [&] { return make(space.recompute.front(), shardings.front(), sps.front()); });
          continue;
        }
        const bool needs_sp = request.model.is_moe() && ep > 1 && grid.tp > 1;
        // Per (sharding, sp): whether a candidate with less recomputation fit (under an injected memory
        // model: was valid), and the last such recomputation.
        std::vector<char> lighter_fits(shardings.size() * sps.size(), 0);
        std::optional<RecomputeGranularity> lightest;
        const int chunk_layers =
            (request.model.num_layers + grid.pp * layout.vpp - 1) / (grid.pp * layout.vpp);
        for (RecomputeGranularity rc : space.recompute)
          for (std::size_t di = 0; di < shardings.size(); ++di)
            for (std::size_t si = 0; si < sps.size(); ++si) {
              const ShardingChoice& d = shardings[di];
              const bool sp = sps[si];
              if (needs_sp && !sp) {
                filter.refuse(1, [&] { return make(rc, d, sp); });
                continue;
              }
              char& lighter = lighter_fits[di * sps.size() + si];
              if (rc != RecomputeGranularity::kFull) {
                lighter = static_cast<char>(filter.add(make(rc, d, sp)) || lighter);
                lightest = rc;
                continue;
              }
              // Uniform 1 (or the pinned rule); block units only where full recomputation is needed: no
              // lighter recomputation of the same knobs fits and the heavier uniform 1 does.
              bool fits = filter.add(make(rc, d, sp));
              const std::vector<int> blocks = block_recompute_layers(space, chunk_layers);
              if (blocks.empty()) continue;
              if (filter.sizes_at_enumeration() && (lighter || !fits)) continue;
              // An injected model sizes lazily: whether a lighter candidate fits is not known here, so the
              // block units are searched only where no lighter recomputation is (--recompute-granularity
              // full).
              if (!filter.sizes_at_enumeration() && lightest) continue;
              for (int layers : blocks) {
                if (!fits) break;
                fits = filter.add(make_candidate(
                    request, grid, layout,
                    {ep, etp, mbs, rc, d.dopt, sp, d.fsdp, layouts::RecomputeMethod::kBlock, layers}));
              }
            }
      }
}

}  // namespace

void SmallestOutOfMemory::note(std::int64_t peak_bytes, const LayoutCandidate& candidate) {
  if (peak_bytes >= bytes) return;
  bytes = peak_bytes;
  layout = describe(candidate);
}

void check_pinned_knobs(const PlanRequest& request) {
  check_knobs(request.model, request.world_size, request.global_batch_size, request.space);
}

CandidateSet enumerate_candidates(const PlanRequest& request, int gpus_per_node, double capacity_bytes,
                                  PlanStatistics& stats) {
  CandidateSet out;
  CandidateFilter filter(request, capacity_bytes, stats, out);
  for (const Grid& grid : grids(request, gpus_per_node)) enumerate_grid(request, grid, filter);
  return out;
}

[[noreturn]] void throw_nothing_fits(const PlanStatistics& stats, const PlanRequest& request,
                                     const SmallestOutOfMemory& oom, double capacity,
                                     const std::string& first_invalid) {
  const std::int64_t smallest_oom = oom.bytes;
  const std::string& smallest_oom_desc = oom.layout;
  const SearchSpace& pinned = request.space;
  if (stats.enumerated == 0 && !pinned.pipeline_layout.empty()) {
    // The pinned layout string itself is the problem (parse or layer-count errors name it), or its stage
    // count fits no pp of this cluster.
    const PipelineLayout layout =
        PipelineLayout::parse(pinned.pipeline_layout, pinned.pp.empty() ? 1 : pinned.pp[0]);
    layout.validate(request.model.num_layers, request.model.mtp_num_layers);
    throw UserError("--pipeline-model-parallel-layout has " + std::to_string(layout.num_stages()) +
                    " stages: no pipeline size dividing them also divides the " +
                    std::to_string(request.world_size) + " GPUs and --global-batch-size " +
                    std::to_string(request.global_batch_size) +
                    "; give a layout with a stage count that divides the GPUs");
  }
  if (stats.enumerated == 0 && pins_pipeline_split(pinned)) {
    throw UserError(
        "no pipeline size of the " + std::to_string(request.world_size) + " GPUs splits the " +
        std::to_string(request.model.num_layers) +
        " layers as --decoder-first/last-pipeline-num-layers or "
        "--account-for-embedding/loss-in-pipeline-split "
        "ask (the other ranks' layers must split evenly): change those flags, pin --pp, or drop them");
  }
  if (stats.enumerated == 0) {
    throw UserError("no (tp, cp, pp, dp) divides the " + std::to_string(request.world_size) + " GPUs, the " +
                    std::to_string(request.model.num_layers) + " layers and --global-batch-size " +
                    std::to_string(request.global_batch_size) +
                    ": give a --global-batch-size divisible by the data-parallel size (e.g. a multiple of " +
                    std::to_string(request.world_size) + "), or unpin --tp/--pp/--cp/--dp/--mbs");
  }
  if (stats.out_of_memory == 0) {
    throw UserError("no parallel layout is valid (" + std::to_string(stats.invalid) +
                    " candidates rejected; first: " + first_invalid + ")");
  }
  const double ratio = capacity > 0 ? static_cast<double>(smallest_oom) / capacity : 0.0;
  char times[32];
  std::snprintf(times, sizeof times, "%.1f", ratio);
  const SearchSpace& space = request.space;
  std::string unpin;
  if (space.recompute.size() == 1) unpin += " --recompute-granularity";
  if (!space.micro_batch.empty()) unpin += " --micro-batch-size";
  if (!space.tp.empty()) unpin += " --tp";
  if (!space.pp.empty()) unpin += " --pp";
  if (!space.cp.empty()) unpin += " --cp";
  throw UserError("no parallel layout fits in memory (" + std::to_string(stats.invalid) + " invalid, " +
                  std::to_string(stats.out_of_memory) + " out of memory; the smallest, " + smallest_oom_desc +
                  ", needs " + format_bytes(static_cast<double>(smallest_oom)) + " of " +
                  format_bytes(capacity) + " usable per GPU, " + times + "x): use more GPUs (--cluster)" +
                  (space.allow_tp_across_nodes ? "" : ", --allow-tp-across-nodes") +
                  (unpin.empty() ? "" : ", drop the pinned" + unpin) + ", or a shorter --seq-length");
}

}  // namespace megatune::planner
