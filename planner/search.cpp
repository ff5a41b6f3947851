// Planner search: enumeration of the layout space, cheap pruning (validation, memory), threaded
// simulation of the survivors, ranking and the winner's explanation.
#include "planner/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "layouts/pipeline_layout.h"
#include "layouts/user_error.h"
#include "layouts/worker_threads.h"
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

const char* recompute_short(RecomputeGranularity g) {
  switch (g) {
    case RecomputeGranularity::kNone:
      return "none";
    case RecomputeGranularity::kSelective:
      return "sel";
    case RecomputeGranularity::kFull:
      return "full";
  }
  return "?";
}

std::string format_ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

// What differs between two configs, e.g. "tp 4 vs 8, sp on vs off".
std::string config_difference(const PlanCandidate& a, const PlanCandidate& b) {
  std::vector<std::string> parts;
  auto cmp = [&](const char* name, int x, int y) {
    if (x != y) parts.push_back(std::string(name) + " " + std::to_string(x) + " vs " + std::to_string(y));
  };
  const ParallelConfig& x = a.config;
  const ParallelConfig& y = b.config;
  cmp("tp", x.tp(), y.tp());
  cmp("pp", x.pp(), y.pp());
  cmp("vpp", a.vpp, b.vpp);
  cmp("dp", x.dp(), y.dp());
  cmp("cp", x.cp(), y.cp());
  cmp("ep", x.ep(), y.ep());
  cmp("etp", x.etp(), y.etp());
  cmp("mbs", x.micro_batch_size, y.micro_batch_size);
  if (x.recompute_granularity != y.recompute_granularity)
    parts.push_back(std::string("recompute ") + recompute_short(x.recompute_granularity) + " vs " +
                    recompute_short(y.recompute_granularity));
  if (x.use_distributed_optimizer != y.use_distributed_optimizer)
    parts.push_back(std::string("dist-opt ") + (x.use_distributed_optimizer ? "on" : "off") + " vs " +
                    (y.use_distributed_optimizer ? "on" : "off"));
  if (x.sequence_parallel_enabled() != y.sequence_parallel_enabled())
    parts.push_back(std::string("sp ") + (x.sequence_parallel_enabled() ? "on" : "off") + " vs " +
                    (y.sequence_parallel_enabled() ? "on" : "off"));
  if (a.layout != b.layout && x.pp() == y.pp() && a.vpp == b.vpp)
    parts.push_back("layout " + a.layout + " vs " + b.layout);
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out.empty() ? "same knobs" : out;
}

std::string explain(const PlanCandidate& winner, const PlanCandidate& runner) {
  const SimulationResult& w = winner.simulation;
  const SimulationResult& r = runner.simulation;
  const double w_bubble = w.step_time_s - w.compute_s - w.exposed_comm_s;
  const double r_bubble = r.step_time_s - r.compute_s - r.exposed_comm_s;
  struct Term {
    const char* name;
    double saved_s;
  };
  std::vector<Term> terms = {{"compute (incl. recomputation)", r.compute_s - w.compute_s},
                             {"exposed communication", r.exposed_comm_s - w.exposed_comm_s},
                             {"pipeline bubble and waiting", r_bubble - w_bubble}};
  auto best = std::max_element(terms.begin(), terms.end(),
                               [](const Term& a, const Term& b) { return a.saved_s < b.saved_s; });
  const double gap = r.step_time_s - w.step_time_s;
  std::ostringstream out;
  out << "#1 beats #2 by " << format_ms(gap) << " per step";
  if (r.step_time_s > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.1f%%)", 100.0 * gap / r.step_time_s);
    out << pct;
  }
  if (best->saved_s > 0) out << ": " << format_ms(best->saved_s) << " less " << best->name;
  out << " [" << config_difference(winner, runner) << "]";
  return out.str();
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

// A knob the user pinned (--tp, --pp, --cp, --ep) that cannot work on this model and cluster gets a
// message naming the knob, why, and the values that would work, instead of "no layout fits".
void check_pinned_knobs(const layouts::ModelSpec& model, int world, int global_batch_size,
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

// Why no candidate survived, with advice that fits the reason.
[[noreturn]] void throw_nothing_fits(const PlanStatistics& stats, const PlanRequest& request,
                                     std::int64_t smallest_oom, const std::string& smallest_oom_desc,
                                     double capacity, const std::string& first_invalid) {
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

}  // namespace

std::string describe(const PlanCandidate& c) {
  std::ostringstream out;
  out << "tp" << c.config.tp() << " pp" << c.config.pp() << " vpp" << c.vpp << " dp" << c.config.dp() << " cp"
      << c.config.cp() << " ep" << c.config.ep() << " etp" << c.config.etp() << " mbs"
      << c.config.micro_batch_size << ' ' << recompute_short(c.config.recompute_granularity)
      << (c.config.sequence_parallel_enabled() ? " sp" : "")
      << (c.config.use_distributed_optimizer ? " dopt" : "");
  return out.str();
}

PlanResult plan(const PlanRequest& request, const OpPricer& pricer) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  PlanStatistics& stats = result.statistics;
  const layouts::ModelSpec& model = request.model;
  const SearchSpace& space = request.space;
  const int world = request.world_size;
  if (world <= 0) throw UserError("--cluster: the world size must be positive");
  if (request.global_batch_size <= 0) throw UserError("--global-batch-size must be positive");
  if (space.distributed_optimizer.empty() || space.sequence_parallel.empty() || space.recompute.empty())
    throw UserError("planner: the search space needs at least one recompute, dist-opt and SP choice");
  const int node = pricer.gpus_per_node();
  result.memory_capacity_bytes = pricer.memory_capacity_bytes();
  if (!(request.memory_headroom_fraction >= 0.0 && request.memory_headroom_fraction < 1.0))
    throw UserError("--memory-headroom must be a fraction in [0, 1), e.g. 0.05");
  check_pinned_knobs(model, world, request.global_batch_size, space);
  const double capacity = result.memory_capacity_bytes * (1.0 - request.memory_headroom_fraction);

  const std::vector<int> tps =
      !space.tp.empty() ? space.tp : powers_of_two_up_to(space.allow_tp_across_nodes ? world : node);
  const std::vector<int> cps = !space.cp.empty() ? space.cp : powers_of_two_up_to(world);
  const std::vector<int> mbss = !space.micro_batch.empty() ? space.micro_batch : std::vector<int>{1, 2, 4, 8};

  std::vector<PlanCandidate> survivors;
  std::int64_t smallest_oom = INT64_MAX;
  std::string smallest_oom_desc;
  // An injected memory model (the executor's sizing pass, milliseconds per layout) judges only the candidates
  // that would be simulated, in lower-bound order; Megatron's closed-form model judges every one up front.
  const bool deferred_memory = static_cast<bool>(request.peak_memory_of);
  MemoryOptions memory_options = request.memory;
  memory_options.step = request.step;
  std::string first_invalid;
  for (int tp : tps) {
    if (tp > world || world % tp != 0) continue;
    if (model.num_attention_heads % tp != 0) continue;
    for (int cp : cps) {
      if (world % (tp * cp) != 0 || model.seq_length % (2 * cp) != 0) continue;
      if (cp > 1 && model.seq_length / cp < 512) continue;  // too short a chunk to be worth a ring
      const std::vector<int> pps =
          !space.pp.empty() ? space.pp : divisors(world / (tp * cp), model.num_layers);
      for (int pp : pps) {
        if (world % (tp * cp * pp) != 0) continue;
        const int dp = world / (tp * cp * pp);
        if (request.global_batch_size % dp != 0) continue;
        if (space.dp > 0 && dp != space.dp) continue;
        const std::vector<LayoutChoice> choices = layout_choices(model, pp, space);
        // Expert layouts.
        std::vector<std::pair<int, int>> experts;  // (ep, etp)
        if (model.is_moe()) {
          const std::vector<int> eps =
              !space.ep.empty() ? space.ep : divisors(model.num_experts, model.num_experts);
          for (int ep : eps) {
            std::vector<int> etps = !space.etp.empty() ? space.etp : std::vector<int>{1, tp};
            std::sort(etps.begin(), etps.end());
            etps.erase(std::unique(etps.begin(), etps.end()), etps.end());
            for (int etp : etps)
              if ((world / pp) % (ep * etp) == 0) experts.push_back({ep, etp});
          }
        } else {
          experts.push_back({1, 0});
        }
        for (const LayoutChoice& layout : choices) {
          for (auto [ep, etp] : experts) {
            for (int mbs : mbss) {
              if ((request.global_batch_size / dp) % mbs != 0) continue;
              for (RecomputeGranularity rc : space.recompute) {
                // Sharding does nothing without data parallelism; SP nothing without TP.
                const std::vector<bool> dopts = dp * cp == 1
                                                    ? std::vector<bool>{space.distributed_optimizer.front()}
                                                    : space.distributed_optimizer;
                const std::vector<bool> sps = tp == 1 ? std::vector<bool>{false} : space.sequence_parallel;
                for (bool dopt : dopts) {
                  for (bool sp : sps) {
                    ++stats.enumerated;
                    PlanCandidate c;
                    ParallelConfig& cfg = c.config;
                    cfg.world_size = world;
                    cfg.tensor_model_parallel_size = tp;
                    cfg.context_parallel_size = cp;
                    cfg.pipeline_model_parallel_size = pp;
                    cfg.expert_model_parallel_size = ep;
                    cfg.expert_tensor_parallel_size = etp;
                    cfg.micro_batch_size = mbs;
                    cfg.global_batch_size = request.global_batch_size;
                    cfg.sequence_parallel = sp;
                    cfg.recompute_granularity = rc;
                    if (rc == RecomputeGranularity::kFull) {
                      cfg.recompute_method = space.recompute_method;
                      cfg.recompute_num_layers = space.recompute_num_layers;
                    }
                    cfg.moe_token_dispatcher_type = space.moe_dispatcher;
                    cfg.rank_order = space.rank_order;
                    if (layout.vpp > 1) cfg.microbatch_group_size_per_vp_stage = space.microbatch_group_size;
                    cfg.use_distributed_optimizer = dopt;
                    cfg.overlap_grad_reduce = dp * cp > 1;
                    cfg.overlap_param_gather = dopt && dp * cp > 1;
                    if (layout.vpp > 1 && pp == 2) cfg.overlap_p2p_comm = true;
                    layout.apply(model, cfg);
                    c.layout = layout.text;
                    c.vpp = layout.vpp;
                    try {
                      cfg.validate(model);
                    } catch (const std::exception& e) {
                      if (stats.invalid++ == 0) first_invalid = describe(c) + ": " + e.what();
                      continue;
                    }
                    if (deferred_memory) {  // sized later, only if simulated (see run_one)
                      survivors.push_back(std::move(c));
                      continue;
                    }
                    MemoryEstimate peak = peak_memory(model, cfg, memory_options);
                    c.peak_memory_bytes = peak.total_bytes;
                    c.peak_memory_pp_rank = peak.pp_rank;
                    if (peak.total_bytes > capacity) {
                      ++stats.out_of_memory;
                      if (peak.total_bytes < smallest_oom) {
                        smallest_oom = peak.total_bytes;
                        smallest_oom_desc = describe(c);
                      }
                      continue;
                    }
                    survivors.push_back(std::move(c));
                  }
                }
              }
            }
          }
        }
      }
    }
  }

  if (survivors.empty())
    throw_nothing_fits(stats, request, smallest_oom, smallest_oom_desc, capacity, first_invalid);

  // Lower bounds first (cheap), then simulate in increasing bound order on `threads` threads, skipping a
  // candidate whose bound exceeds the k-th best step time found so far. The calling thread works too and
  // reports progress.
  const auto sim_start = std::chrono::steady_clock::now();
  const int threads = std::clamp(request.threads, 1, max_worker_threads());
  const std::size_t keep_k = static_cast<std::size_t>(std::max(2, request.top_k));
  // The bound prices the passes exactly as the simulation does (same options), so it never exceeds it.
  SimulationOptions sim_options;
  sim_options.step = request.step;
  sim_options.tp_comm_overlap = request.tp_comm_overlap;
  std::vector<double> bounds(survivors.size(), 0.0);
  {
    std::atomic<std::size_t> next_bound{0};
    auto bound_worker = [&] {
      for (std::size_t i = next_bound.fetch_add(1); i < survivors.size(); i = next_bound.fetch_add(1)) {
        try {
          bounds[i] = step_time_lower_bound(model, survivors[i].config, pricer, sim_options);
        } catch (const std::exception&) {
          bounds[i] = 0.0;  // simulate it; the simulation reports the problem
        }
      }
    };
    WorkerThreads pool(threads - 1, bound_worker);
    bound_worker();
  }
  std::vector<std::size_t> by_bound(survivors.size());
  for (std::size_t i = 0; i < by_bound.size(); ++i) by_bound[i] = i;
  std::sort(by_bound.begin(), by_bound.end(),
            [&](std::size_t a, std::size_t b) { return bounds[a] < bounds[b]; });

  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::atomic<std::int64_t> pruned{0};
  std::mutex mutex;                // guards best_times and the failure fields
  std::vector<double> best_times;  // the keep_k smallest step times so far, sorted
  std::vector<char> ok(survivors.size(), 0);
  auto threshold = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return best_times.size() < keep_k ? std::numeric_limits<double>::infinity() : best_times.back();
  };
  std::atomic<std::int64_t> deferred_out_of_memory{0};
  auto fits = [&](PlanCandidate& c) {
    const MemoryEstimate peak = request.peak_memory_of(model, c.config, memory_options);
    c.peak_memory_bytes = peak.total_bytes;
    c.peak_memory_pp_rank = peak.pp_rank;
    if (peak.total_bytes <= capacity) return true;
    deferred_out_of_memory.fetch_add(1);
    std::lock_guard<std::mutex> lock(mutex);
    if (peak.total_bytes < smallest_oom) {
      smallest_oom = peak.total_bytes;
      smallest_oom_desc = describe(c);
    }
    return false;
  };
  auto run_one = [&](std::size_t i) {
    if (bounds[i] > threshold()) {
      pruned.fetch_add(1);
      return;
    }
    try {
      if (deferred_memory && !fits(survivors[i])) return;
      survivors[i].simulation = simulate(model, survivors[i].config, pricer, sim_options);
      ok[i] = 1;
      std::lock_guard<std::mutex> lock(mutex);
      const double t = survivors[i].simulation.step_time_s;
      best_times.insert(std::upper_bound(best_times.begin(), best_times.end(), t), t);
      if (best_times.size() > keep_k) best_times.pop_back();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      ++stats.failed;
      if (stats.first_failure.empty()) stats.first_failure = describe(survivors[i]) + ": " + e.what();
    }
  };
  auto worker = [&] {
    for (std::size_t k = next.fetch_add(1); k < by_bound.size(); k = next.fetch_add(1)) {
      run_one(by_bound[k]);
      done.fetch_add(1);
    }
  };
  WorkerThreads pool(threads - 1, worker);
  for (std::size_t k = next.fetch_add(1); k < by_bound.size(); k = next.fetch_add(1)) {
    run_one(by_bound[k]);
    const std::int64_t finished = done.fetch_add(1) + 1;
    if (request.progress) request.progress(finished, static_cast<std::int64_t>(survivors.size()));
  }
  pool.join();
  if (request.progress)
    request.progress(static_cast<std::int64_t>(survivors.size()),
                     static_cast<std::int64_t>(survivors.size()));
  stats.pruned_by_bound = pruned.load();
  stats.out_of_memory += deferred_out_of_memory.load();
  stats.simulated = static_cast<std::int64_t>(survivors.size()) - stats.failed - stats.pruned_by_bound -
                    deferred_out_of_memory.load();
  stats.simulate_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sim_start).count();

  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < survivors.size(); ++i)
    if (ok[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double ta = survivors[a].simulation.step_time_s, tb = survivors[b].simulation.step_time_s;
    if (ta != tb) return ta < tb;
    return survivors[a].peak_memory_bytes < survivors[b].peak_memory_bytes;
  });
  const std::size_t keep = std::min<std::size_t>(order.size(), std::max(1, request.top_k));
  for (std::size_t i = 0; i < keep; ++i) result.ranked.push_back(std::move(survivors[order[i]]));
  if (result.ranked.empty() && stats.failed == 0)
    throw_nothing_fits(stats, request, smallest_oom, smallest_oom_desc, capacity, first_invalid);
  if (result.ranked.empty()) {
    throw std::runtime_error("every candidate failed to simulate; first: " + stats.first_failure);
  }
  if (result.ranked.size() >= 2) result.why_winner = explain(result.ranked[0], result.ranked[1]);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace megatune::planner
