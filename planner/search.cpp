// Planner search: the candidates (search_candidates.h), their lower bounds, threaded simulation in bound
// order (memory sized only for what would be simulated), ranking and the winner's explanation.
#include "planner/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/user_error.h"
#include "base/worker_threads.h"
#include "planner/search_candidates.h"
#include "planner/simulation_cache.h"

namespace megatune::planner {

using layouts::ParallelConfig;
using layouts::RecomputeGranularity;

namespace {

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
  if (x.fsdp() != y.fsdp() || (x.fsdp() && x.sharding() != y.sharding()))
    parts.push_back("fsdp " + std::string(x.fsdp() ? layouts::to_string(x.sharding()) : "off") + " vs " +
                    std::string(y.fsdp() ? layouts::to_string(y.sharding()) : "off"));
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

// --time-limit: when the search stops bounding and simulating (never, without a limit).
class Deadline {
 public:
  Deadline(std::chrono::steady_clock::time_point start, double limit_s)
      : limited_(limit_s > 0),
        at_(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(limited_ ? limit_s : 0.0))) {}
  bool passed() const { return limited_ && std::chrono::steady_clock::now() >= at_; }

 private:
  bool limited_;
  std::chrono::steady_clock::time_point at_;
};

// Each candidate's step-time lower bound, on `threads` threads (0 where the bound fails: the simulation
// reports the problem; +infinity for the candidates the deadline left unbounded, simulated last).
std::vector<double> lower_bounds(const PlanRequest& request, const OpPricer& pricer,
                                 const std::vector<LayoutCandidate>& candidates,
                                 const SimulationOptions& options, int threads, const Deadline& deadline) {
  std::vector<double> bounds(candidates.size(), std::numeric_limits<double>::infinity());
  std::atomic<std::size_t> next{0};
  auto bound = [&](std::size_t i) {
    try {
      bounds[i] =
          step_time_lower_bound(request.model, candidates[i].config, pricer, options, BoundTerms::kPasses);
    } catch (const std::exception&) {
      bounds[i] = 0.0;
    }
  };
  auto worker = [&] {
    for (std::size_t i = next.fetch_add(1); i < candidates.size() && !deadline.passed();
         i = next.fetch_add(1))
      bound(i);
  };
  WorkerThreads pool(threads - 1, worker);
  const auto total = static_cast<std::int64_t>(candidates.size());
  for (std::size_t i = next.fetch_add(1); i < candidates.size() && !deadline.passed();
       i = next.fetch_add(1)) {
    bound(i);
    if (request.progress) request.progress({"bounding", static_cast<std::int64_t>(i) + 1, total});
  }
  pool.join();
  if (request.progress) request.progress({"bounding", total, total});
  return bounds;
}

// Simulates candidates in increasing bound order on several threads, skipping one whose bound exceeds the
// k-th best step time found so far; an injected memory model sizes each candidate just before (stopping at
// the first pipeline rank past the capacity). Past the deadline, once a candidate has been simulated, the
// rest are left unreached.
class SimulationPhase {
 public:
  SimulationPhase(const PlanRequest& request, const OpPricer& pricer, CandidateSet& set, double capacity,
                  const Deadline& deadline)
      : request_(request),
        pricer_(pricer),
        set_(set),
        capacity_(capacity),
        deadline_(deadline),
        results_(set.candidates.size()) {
    options_.step = request.step;
    options_.tp_comm_overlap = request.tp_comm_overlap;
    options_.cache = &cache_;
    memory_options_ = request.memory;
    memory_options_.step = request.step;
    keep_k_ = static_cast<std::size_t>(std::max(2, request.top_k));
  }
  const SimulationOptions& options() const { return options_; }

  void run(const std::vector<double>& bounds, int threads) {
    bounds_ = &bounds;
    order_.resize(bounds.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(),
              [&](std::size_t a, std::size_t b) { return bounds[a] < bounds[b]; });
    auto worker = [this] {
      for (std::size_t k = next_.fetch_add(1); k < order_.size(); k = next_.fetch_add(1)) run_one(order_[k]);
    };
    WorkerThreads pool(threads - 1, worker);
    const auto total = static_cast<std::int64_t>(order_.size());
    for (std::size_t k = next_.fetch_add(1); k < order_.size(); k = next_.fetch_add(1)) {
      run_one(order_[k]);
      if (request_.progress) request_.progress({"simulating", done_.load(), total, best_step_s()});
    }
    pool.join();
    if (request_.progress) request_.progress({"simulating", total, total, best_step_s()});
  }

  // The simulated candidates' results (by candidate; empty where not simulated), to be taken.
  std::vector<std::unique_ptr<SimulationResult>>& results() { return results_; }

  // Indices of the simulated candidates.
  std::vector<std::size_t> simulated() const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < results_.size(); ++i)
      if (results_[i]) out.push_back(i);
    return out;
  }

  void add_statistics(PlanStatistics& stats) const {
    stats.pruned_by_bound = pruned_.load();
    stats.out_of_memory += out_of_memory_.load();
    stats.failed = failed_;
    stats.first_failure = first_failure_;
    stats.simulated = static_cast<std::int64_t>(simulated().size());
    stats.not_reached = not_reached_.load();
    stats.stopped_by_time_limit = stats.not_reached > 0;
  }

  // With nothing simulated: the exact smallest peak among the candidates whose sizing stopped early.
  void settle_smallest_out_of_memory() {
    std::sort(unfinished_.begin(), unfinished_.end());
    MemoryOptions full = memory_options_;
    full.stop_above_bytes = 0;
    for (const auto& [partial_bytes, i] : unfinished_) {
      if (partial_bytes >= set_.smallest_oom.bytes) break;
      const LayoutCandidate& c = set_.candidates[i];
      set_.smallest_oom.note(request_.peak_memory_of(request_.model, c.config, full).total_bytes, c);
    }
  }

 private:
  double threshold() {
    std::lock_guard<std::mutex> lock(mutex_);
    return best_times_.size() < keep_k_ ? std::numeric_limits<double>::infinity() : best_times_.back();
  }
  double best_step_s() {
    std::lock_guard<std::mutex> lock(mutex_);
    return best_times_.empty() ? 0.0 : best_times_.front();
  }

  bool fits(std::size_t i) {
    LayoutCandidate& c = set_.candidates[i];
    MemoryOptions options = memory_options_;
    options.stop_above_bytes = static_cast<std::int64_t>(capacity_);
    const MemoryEstimate peak = request_.peak_memory_of(request_.model, c.config, options);
    c.peak_memory_bytes = peak.total_bytes;
    c.peak_memory_pp_rank = peak.pp_rank;
    if (peak.total_bytes <= capacity_) return true;
    out_of_memory_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mutex_);
    if (peak.complete)
      set_.smallest_oom.note(peak.total_bytes, c);
    else
      unfinished_.push_back({peak.total_bytes, i});
    return false;
  }

  void run_one(std::size_t i) {
    done_.fetch_add(1);
    if (deadline_.passed() && best_step_s() > 0.0) {
      not_reached_.fetch_add(1);
      return;
    }
    if ((*bounds_)[i] > threshold()) {
      pruned_.fetch_add(1);
      return;
    }
    const LayoutCandidate& c = set_.candidates[i];
    try {
      // The tighter bound (with the gradient sync) only for the candidates the cheap one let through.
      if (step_time_lower_bound(request_.model, c.config, pricer_, options_) > threshold()) {
        pruned_.fetch_add(1);
        return;
      }
      if (request_.peak_memory_of && !fits(i)) return;
      results_[i] = std::make_unique<SimulationResult>(simulate(request_.model, c.config, pricer_, options_));
      std::lock_guard<std::mutex> lock(mutex_);
      const double t = results_[i]->step_time_s;
      best_times_.insert(std::upper_bound(best_times_.begin(), best_times_.end(), t), t);
      if (best_times_.size() > keep_k_) best_times_.pop_back();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed_++ == 0) first_failure_ = describe(c) + ": " + e.what();
    }
  }

  const PlanRequest& request_;
  const OpPricer& pricer_;
  CandidateSet& set_;
  double capacity_;
  const Deadline& deadline_;
  SimulationCache cache_;
  SimulationOptions options_;
  MemoryOptions memory_options_;
  std::size_t keep_k_ = 2;
  const std::vector<double>* bounds_ = nullptr;
  std::vector<std::size_t> order_;
  std::vector<std::unique_ptr<SimulationResult>> results_;  // per candidate, where simulated
  std::atomic<std::size_t> next_{0};
  std::atomic<std::int64_t> done_{0}, pruned_{0}, out_of_memory_{0}, not_reached_{0};
  std::mutex mutex_;                // guards the fields below
  std::vector<double> best_times_;  // the keep_k smallest step times so far, sorted
  std::vector<std::pair<std::int64_t, std::size_t>> unfinished_;  // (partial peak, candidate) out of memory
  std::int64_t failed_ = 0;
  std::string first_failure_;
};

// The simulated candidates, fastest first (ties: less memory), at most top_k.
std::vector<PlanCandidate> ranked(const PlanRequest& request, CandidateSet& set,
                                  std::vector<std::unique_ptr<SimulationResult>>& results,
                                  std::vector<std::size_t> order) {
  const std::vector<LayoutCandidate>& c = set.candidates;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double ta = results[a]->step_time_s, tb = results[b]->step_time_s;
    if (ta != tb) return ta < tb;
    return c[a].peak_memory_bytes < c[b].peak_memory_bytes;
  });
  const std::size_t keep = std::min<std::size_t>(order.size(), std::max(1, request.top_k));
  std::vector<PlanCandidate> out;
  for (std::size_t i = 0; i < keep; ++i) {
    PlanCandidate& candidate = out.emplace_back();
    static_cast<LayoutCandidate&>(candidate) = std::move(set.candidates[order[i]]);
    candidate.layout = candidate.stages->to_string();
    candidate.simulation = std::move(*results[order[i]]);
  }
  return out;
}

}  // namespace

std::string describe(const LayoutCandidate& c) {
  std::ostringstream out;
  out << "tp" << c.config.tp() << " pp" << c.config.pp() << " vpp" << c.vpp << " dp" << c.config.dp() << " cp"
      << c.config.cp() << " ep" << c.config.ep() << " etp" << c.config.etp() << " mbs"
      << c.config.micro_batch_size << ' ' << recompute_short(c.config.recompute_granularity);
  // Full recomputation other than every layer alone: its unit rule ("full:block2", "full:uniform3").
  if (c.config.recompute_granularity == RecomputeGranularity::kFull &&
      !(c.config.recompute_method == layouts::RecomputeMethod::kUniform &&
        c.config.recompute_num_layers == 1))
    out << ':' << layouts::to_string(c.config.recompute_method) << c.config.recompute_num_layers;
  out << (c.config.sequence_parallel_enabled() ? " sp" : "")
      << (c.config.use_distributed_optimizer ? " dopt" : "");
  if (c.config.fsdp()) out << " fsdp:" << layouts::to_string(c.config.sharding());
  return out.str();
}

PlanResult plan(const PlanRequest& request, const OpPricer& pricer) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  PlanStatistics& stats = result.statistics;
  const SearchSpace& space = request.space;
  if (request.world_size <= 0) throw UserError("--cluster: the world size must be positive");
  if (request.global_batch_size <= 0) throw UserError("--global-batch-size must be positive");
  if ((space.distributed_optimizer.empty() && space.fsdp.empty()) || space.sequence_parallel.empty() ||
      space.recompute.empty())
    throw UserError(
        "planner: the search space needs at least one recompute, dist-opt (or FSDP) and SP choice");
  result.memory_capacity_bytes = pricer.memory_capacity_bytes();
  if (!(request.memory_headroom_fraction >= 0.0 && request.memory_headroom_fraction < 1.0))
    throw UserError("--memory-headroom must be a fraction in [0, 1), e.g. 0.05");
  check_pinned_knobs(request);
  const double capacity = result.memory_capacity_bytes * (1.0 - request.memory_headroom_fraction);

  CandidateSet set = enumerate_candidates(request, pricer.gpus_per_node(), capacity, stats);
  if (set.candidates.empty())
    throw_nothing_fits(stats, request, set.smallest_oom, capacity, set.first_invalid);

  const auto sim_start = std::chrono::steady_clock::now();
  const int threads = std::clamp(request.threads, 1, max_worker_threads());
  const Deadline deadline(start, request.time_limit_s);
  SimulationPhase phase(request, pricer, set, capacity, deadline);
  // The bound prices the passes exactly as the simulation does (same options), so it never exceeds it.
  phase.run(lower_bounds(request, pricer, set.candidates, phase.options(), threads, deadline), threads);
  phase.add_statistics(stats);
  stats.simulate_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sim_start).count();

  result.ranked = ranked(request, set, phase.results(), phase.simulated());
  if (result.ranked.empty() && stats.failed == 0) {
    phase.settle_smallest_out_of_memory();
    throw_nothing_fits(stats, request, set.smallest_oom, capacity, set.first_invalid);
  }
  if (result.ranked.empty())
    throw std::runtime_error("every candidate failed to simulate; first: " + stats.first_failure);
  if (result.ranked.size() >= 2) result.why_winner = explain(result.ranked[0], result.ranked[1]);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace megatune::planner
