// Step simulator: builds per-rank task lists (per op, or per pass with ops priced once per layer kind),
// maps communication onto engine groups, replays them and summarizes.
#include "planner/simulator.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "layouts/rank_grid.h"
#include "layouts/schedule.h"
#include "layouts/schedule_walker.h"
#include "planner/event_engine.h"
#include "planner/simulation_cache.h"
#include "planner/simulator_parts.h"
#include "planner/tp_comm_overlap.h"

namespace megatune::planner {

using layouts::CommGroup;
using layouts::LayerSymbol;
using layouts::Op;
using layouts::OpKind;
using layouts::OpPhase;
using layouts::PipelineStage;

namespace {

bool is_cp_ring(const Op& op) { return op.role == layouts::OpRole::kContextParallelRing; }

bool is_param_gather(const Op& op) {
  return op.role == layouts::OpRole::kParamGather || op.role == layouts::OpRole::kExpertParamGather;
}

bool is_fsdp_gather(const Op& op) {
  return op.role == layouts::OpRole::kFsdpParamGather || op.role == layouts::OpRole::kFsdpExpertParamGather;
}

// FSDP's prefetch: a segment's parameter gather runs while the previous segment computes, so only what
// exceeds that compute stalls. `credit_s`: the compute since the previous gathers; returns the exposed time.
double exposed_gather_s(double gather_s, double& credit_s) {
  const double exposed = std::max(0.0, gather_s - credit_s);
  credit_s = std::max(0.0, credit_s - gather_s);
  return exposed;
}

// p2p tag: (tensor, microbatch, producer stage).
std::int64_t p2p_tag(bool gradient, int microbatch, int producer_stage) {
  return (static_cast<std::int64_t>(gradient) << 40) | (static_cast<std::int64_t>(microbatch) << 20) |
         static_cast<std::int64_t>(producer_stage);
}

// Whether every op of a pass is priced from the cache's key alone: no group outside kPassGroups, no pipeline
// p2p.
bool priced_by_key(const std::vector<Op>& ops) {
  for (const Op& op : ops) {
    if (!op.is_communication()) continue;
    if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
      if (!is_cp_ring(op)) return false;
      continue;
    }
    if (std::find(kPassGroups.begin(), kPassGroups.end(), op.group) == kPassGroups.end()) return false;
  }
  return true;
}

class Builder {
 public:
  Builder(const layouts::ModelSpec& model, const layouts::ParallelConfig& config, const OpPricer& pricer,
          const SimulationOptions& options, SimulationResult& result)
      : model_(model),
        config_(config),
        pricer_(pricer),
        options_(options),
        result_(result),
        grid_(layouts::RankGrid::from_config(config)),
        layout_holder_(options.cache != nullptr ? options.cache->layout(model, config)
                                                : std::make_shared<const layouts::PipelineLayout>(
                                                      config.resolved_pipeline_layout(model))),
        layout_(*layout_holder_),
        shape_(layouts::resolve_rank_shape(model, config)),
        recompute_(layouts::RecomputeSettings::of(config)) {
    if (options.all_ranks) {
      for (int r = 0; r < grid_.world_size(); ++r) sim_ranks_.push_back(r);
    } else {
      for (int pp = 0; pp < grid_.pp(); ++pp)
        sim_ranks_.push_back(grid_.rank_of(layouts::DenseCoordinates{0, 0, 0, pp}));
    }
    groups_ = std::make_unique<GroupMap>(grid_, sim_ranks_, pricer.gpus_per_node());
  }

  const std::vector<int>& sim_ranks() const { return sim_ranks_; }
  GroupMap& groups() { return *groups_; }
  const layouts::RankGrid& grid() const { return grid_; }

  double price(const Op& op, int sim, std::int64_t occurrences = 1) {
    cost_models::CollectiveGroup placement{1, 1};
    if (op.is_communication()) {
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        const int peer = op.peer_rank >= 0 ? op.peer_rank : sim_ranks_[sim];
        const int node = pricer_.gpus_per_node();
        placement.nodes = sim_ranks_[sim] / node == peer / node ? 1 : 2;
        if (is_cp_ring(op))
          placement.nodes = std::min(groups_->lookup(sim, CommGroup::kContext).placement.nodes, 2);
        placement.size = 2;
      } else {
        placement = groups_->lookup(sim, op.group).placement;
      }
    }
    cost_models::OpCost cost = pricer_.price(op, placement);
    result_.provenance_counts[static_cast<int>(cost.provenance)] += occurrences;
    last_provenance_ = cost.provenance;
    return cost.time_s;
  }

  // Puts tasks (with their ops) before every other task of b: the param gathers issued at the start of the
  // iteration on the comm stream, overlapping the first forwards.
  void prepend(RankBuild& b, const std::vector<std::pair<SimTask, std::size_t>>& tasks,
               const std::vector<Op>& ops) const {
    if (tasks.empty()) return;
    RankBuild hoisted;
    for (const auto& [task, index] : tasks) {
      hoisted.tasks.push_back(task);
      if (options_.record_trace) {
        hoisted.names.push_back(ops[index].label);
        hoisted.categories.push_back(layouts::op_kind_name(ops[index].kind));
        hoisted.details.push_back(layouts::to_string(ops[index]));
        hoisted.provenance.push_back("-");
      }
    }
    b.tasks.insert(b.tasks.begin(), hoisted.tasks.begin(), hoisted.tasks.end());
    b.names.insert(b.names.begin(), hoisted.names.begin(), hoisted.names.end());
    b.categories.insert(b.categories.begin(), hoisted.categories.begin(), hoisted.categories.end());
    b.details.insert(b.details.begin(), hoisted.details.begin(), hoisted.details.end());
    b.provenance.insert(b.provenance.begin(), hoisted.provenance.begin(), hoisted.provenance.end());
  }

  // Kernel level: every op of the rank's step program (build_step_program's ops, item by item of the rank's
  // walk) becomes a task.
  RankBuild build_kernel_level(int sim) {
    RankBuild b;
    const layouts::RankStep step = layouts::walk_rank_step(model_, config_, sim_ranks_[sim], options_.step);
    std::vector<Op> ops;
    std::vector<const layouts::StepTransfer*> transfers;  // per op: its pipeline transfer, if one
    for (const layouts::StepItem& item : step.items) {
      std::vector<Op> item_ops = layouts::step_item_ops(model_, config_, step, item, options_.step);
      for (std::size_t k = 0; k < item_ops.size(); ++k) {
        transfers.push_back(item.kind == layouts::StepItemKind::kP2p ? &item.transfers[k] : nullptr);
        ops.push_back(std::move(item_ops[k]));
      }
    }
    double ring_s = 0.0;
    bool waited = false;
    std::vector<std::pair<SimTask, std::size_t>> param_gathers;  // hoisted with overlap_param_gather
    auto add = [&](SimTask t, const Op* op, const std::string& name) {
      b.tasks.push_back(t);
      if (options_.record_trace) {
        b.names.push_back(name);
        b.categories.push_back(op ? layouts::op_kind_name(op->kind) : "wait");
        b.details.push_back(op ? layouts::to_string(*op) : name);
        b.provenance.push_back(op ? cost_models::provenance_name(last_provenance_) : "-");
      }
    };
    std::vector<cost_models::Provenance> provenances;
    const std::vector<double> times_s = price_all(ops, sim, &provenances);
    const std::vector<double> kept_s = stream_times_s(ops, times_s);
    double prefetch_credit_s = 0.0, prefetch_s = 0.0;  // FSDP: compute since the last gathers, and its rest
    bool gathering = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const double t = times_s[i];
      last_provenance_ = provenances[i];
      b.kinds[static_cast<int>(op.kind)].total_s += t;
      b.kinds[static_cast<int>(op.kind)].count += 1;
      if (is_fsdp_gather(op)) {
        if (!gathering) prefetch_s = std::exchange(prefetch_credit_s, 0.0);
        gathering = true;
        SimTask task{TaskKind::kCollective, exposed_gather_s(t, prefetch_s)};
        task.op_index = static_cast<int>(i);
        task.group = groups_->lookup(sim, op.group).id;
        task.category = comm_category(op);
        add(task, &op, op.label);
        continue;
      }
      gathering = false;
      if (!op.is_communication()) prefetch_credit_s += t;
      if (is_cp_ring(op)) {
        ring_s += t;
        continue;
      }
      if (op.phase == OpPhase::kOptimizer && !waited) {
        add(SimTask{TaskKind::kWaitComm}, nullptr, "wait grad sync");
        waited = true;
      }
      SimTask task;
      task.duration_s = kept_s[i];
      task.op_index = static_cast<int>(i);
      if (!op.is_communication()) {
        task.kind = TaskKind::kCompute;
        add(task, &op, op.label);
        if ((op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) && ring_s > 0) {
          // The KV ring overlaps the attention kernel; what it does not hide stalls the CP group.
          SimTask ring{TaskKind::kCollective, std::max(0.0, ring_s - t)};
          ring.group = groups_->lookup(sim, CommGroup::kContext).id;
          ring.category = CommCategory::kContext;
          add(ring, &op, "cp ring (exposed)");
          ring_s = 0.0;
        }
        continue;
      }
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        const int peer_sim = groups_->sim_index(op.peer_rank);
        task.kind = op.kind == OpKind::kSend ? TaskKind::kSend : TaskKind::kRecv;
        task.peer = peer_sim;
        task.category = CommCategory::kPipeline;
        const layouts::StepTransfer& transfer = *transfers.at(i);
        task.tag = p2p_tag(transfer.tensor == layouts::P2pTensor::kGradient, transfer.microbatch,
                           transfer.producer_stage);
        add(task, &op, op.label);
        continue;
      }
      task.group = groups_->lookup(sim, op.group).id;
      task.stream = static_cast<int>(op.stream);
      task.category = comm_category(op);
      const bool grad_sync = op.phase == OpPhase::kGradSync;
      if (is_param_gather(op) && config_.overlap_param_gather) {
        task.kind = TaskKind::kAsyncCollective;
        param_gathers.push_back({task, i});
        continue;
      }
      task.kind =
          grad_sync && config_.overlap_grad_reduce ? TaskKind::kAsyncCollective : TaskKind::kCollective;
      add(task, &op, op.label);
    }
    prepend(b, param_gathers, ops);
    return b;
  }

  // Pass level: ops of each layer kind priced once; one compute task (+ one local delay for its blocking
  // communication) per forward / backward pass.

  // Every op's priced time, in order (a CP ring step is one transfer: priced on its send, its recv is free);
  // with `provenances`, also each price's provenance.
  std::vector<double> price_all(const std::vector<Op>& ops, int sim,
                                std::vector<cost_models::Provenance>* provenances = nullptr) {
    std::vector<double> times_s;
    times_s.reserve(ops.size());
    for (const Op& op : ops) {
      times_s.push_back(op.kind == OpKind::kRecv ? 0.0 : price(op, sim));
      if (provenances != nullptr) provenances->push_back(last_provenance_);
    }
    return times_s;
  }

  // The time each op holds its stream: its price, less what --tp-comm-overlap hides behind a GEMM.
  std::vector<double> stream_times_s(const std::vector<Op>& ops, const std::vector<double>& times_s) const {
    if (!options_.tp_comm_overlap) return times_s;
    return tp_overlapped_times_s(ops, times_s, config_.tp());
  }

  PassCost price_ops(const std::vector<Op>& ops, int sim) {
    PassCost c;
    double ring_s = 0.0;
    const std::vector<double> times_s = price_all(ops, sim);
    const std::vector<double> kept_s = stream_times_s(ops, times_s);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const double t = times_s[i];
      c.kinds[static_cast<int>(op.kind)].total_s += t;
      c.kinds[static_cast<int>(op.kind)].count += 1;
      if (is_cp_ring(op)) {
        ring_s += t;
      } else if (op.is_communication()) {
        c.add_comm(comm_category(op), kept_s[i]);
      } else {
        c.compute_s += t;
        if ((op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) && ring_s > 0) {
          c.add_comm(CommCategory::kContext, std::max(0.0, ring_s - t));
          ring_s = 0.0;
        }
      }
    }
    return c;
  }

  // The step shape a symbol of recompute variant `recompute` is priced with: under full recomputation a kept
  // layer runs as without recomputation, a recomputed one as a unit of one layer.
  layouts::RankShape symbol_shape(layouts::LayerRecompute recompute) const {
    layouts::RankShape shape = shape_;
    if (shape.recompute != layouts::RecomputeGranularity::kFull) return shape;
    if (recompute == layouts::LayerRecompute::kKept) {
      shape.recompute = layouts::RecomputeGranularity::kNone;
      shape.recompute_method = layouts::RecomputeMethod::kNone;
      shape.recompute_num_layers = 0;
    } else {
      shape.recompute_method = layouts::RecomputeMethod::kUniform;
      shape.recompute_num_layers = 1;
    }
    return shape;
  }

  // The ops of one symbol's forward and backward, of a micro-batch after the first (which alone casts the
  // FP8 weights: weight_cast_s). A layer re-run by a later layer of its unit (kUnitInner) carries its re-run
  // (the kRecompute ops of a unit of one) and a kept layer's backward (its norm outputs are recomputed): the
  // same ops as in the pass, where the re-run sits before the unit's last layer.
  std::pair<std::vector<Op>, std::vector<Op>> symbol_ops(const PipelineStage& stage,
                                                         layouts::LayerRecompute recompute) const {
    const layouts::RankShape shape = symbol_shape(recompute);
    std::vector<Op> forward = layouts::stage_forward_ops(model_, shape, stage, 1, options_.step);
    std::vector<Op> backward = layouts::stage_backward_ops(model_, shape, stage, 0, options_.step);
    if (recompute != layouts::LayerRecompute::kUnitInner) return {std::move(forward), std::move(backward)};
    std::vector<Op> inner;
    for (Op& op : backward)
      if (op.phase == OpPhase::kRecompute) inner.push_back(std::move(op));
    for (Op& op : layouts::stage_backward_ops(model_, symbol_shape(layouts::LayerRecompute::kKept), stage, 0,
                                              options_.step))
      inner.push_back(std::move(op));
    return {std::move(forward), std::move(inner)};
  }

  // Costs of one symbol (E, dense t, MoE t, m, L; its recompute variant) for one microbatch on this rank.
  const SymbolCosts& symbol_costs(int sim, LayerSymbol symbol, bool moe,
                                  layouts::LayerRecompute recompute = layouts::LayerRecompute::kKept) {
    const int key = symbol_key(symbol, moe, recompute);
    auto it = symbol_cache_.find(key);
    if (it != symbol_cache_.end()) return it->second;
    SymbolCosts costs;
    if (shared_symbol_costs(sim, key, costs)) return symbol_cache_.emplace(key, costs).first->second;
    PipelineStage stage;
    stage.symbols = {symbol};
    stage.first_decoder_layer = 0;
    if (symbol == LayerSymbol::kDecoder) {
      for (int l = 0; l < model_.num_layers; ++l)
        if (model_.is_moe_layer(l) == moe) {
          stage.first_decoder_layer = l;
          break;
        }
      stage.num_decoder_layers = 1;
    }
    if (symbol == LayerSymbol::kMtp) stage.num_mtp_layers = 1;
    stage.has_embedding = symbol == LayerSymbol::kEmbedding;
    stage.has_loss = symbol == LayerSymbol::kLoss;
    const auto counted = result_.provenance_counts;
    const auto [forward, backward] = symbol_ops(stage, recompute);
    costs.forward = price_ops(forward, sim);
    costs.backward = price_ops(backward, sim);
    for (int p = 0; p < kProvenanceCount; ++p)
      costs.provenance_counts[p] = result_.provenance_counts[p] - counted[p];
    if (options_.step.fp8.enabled()) {  // micro-batch 0's forward: the same ops and the weight casts
      const auto before = result_.provenance_counts;
      const std::vector<Op> first =
          layouts::stage_forward_ops(model_, symbol_shape(recompute), stage, 0, options_.step);
      costs.weight_cast_s = std::max(0.0, price_ops(first, sim).compute_s - costs.forward.compute_s);
      result_.provenance_counts = before;
    }
    if (options_.cache != nullptr && priced_by_key(forward) && priced_by_key(backward))
      options_.cache->add_symbol_costs(config_, pass_placements(sim), key, costs);
    return symbol_cache_.emplace(key, costs).first->second;
  }

  // The pass and sync groups' placements of this grid (every representative's pass groups are placed
  // alike), looked up once per grid.
  const PassPlacements& pass_placements(int sim) {
    if (pass_placements_) return *pass_placements_;
    if (const GridPlacements* cached = options_.cache->placements(config_))
      return *(pass_placements_ = cached->pass);
    GridPlacements placements;
    for (std::size_t g = 0; g < kPassGroups.size(); ++g)
      placements.pass[g] = groups_->lookup(sim, kPassGroups[g]).placement;
    for (int pp = 0; pp < grid_.pp(); ++pp) {
      const int rep = groups_->sim_index(grid_.rank_of(layouts::DenseCoordinates{0, 0, 0, pp}));
      SyncPlacements& sync = placements.sync_by_pp_rank.emplace_back();
      for (std::size_t g = 0; g < kSyncGroups.size(); ++g)
        sync[g] = groups_->lookup(rep, kSyncGroups[g]).placement;
    }
    options_.cache->add_placements(config_, placements);
    return *(pass_placements_ = placements.pass);
  }

  // A symbol's costs from the search's shared cache, its provenance counted into this result.
  bool shared_symbol_costs(int sim, int key, SymbolCosts& costs) {
    if (options_.cache == nullptr) return false;
    const SymbolCosts* shared = options_.cache->symbol_costs(config_, pass_placements(sim), key);
    if (shared == nullptr) return false;
    costs = *shared;
    for (int p = 0; p < kProvenanceCount; ++p) result_.provenance_counts[p] += costs.provenance_counts[p];
    return true;
  }

  // Compute + blocking communication of one microbatch's forward and backward through a stage (one chunk).
  std::pair<double, double> stage_pass_s(int sim, const PipelineStage& stage) {
    double forward = 0.0, backward = 0.0;
    int next_layer = stage.first_decoder_layer;
    const std::vector<layouts::LayerRecompute> variants = layouts::symbol_recompute(recompute_, stage);
    for (std::size_t i = 0; i < stage.symbols.size(); ++i) {
      const LayerSymbol sym = stage.symbols[i];
      const bool moe = sym == LayerSymbol::kDecoder && model_.is_moe_layer(next_layer);
      if (sym == LayerSymbol::kDecoder) ++next_layer;
      const SymbolCosts& sc = symbol_costs(sim, sym, moe, variants[i]);
      forward += sc.forward.compute_s + sc.forward.comm_s;
      backward += sc.backward.compute_s + sc.backward.comm_s;
    }
    return {forward, backward};
  }

  // step_time_lower_bound: the pipeline bound over this layout's stage passes.
  double lower_bound(bool with_sync) {
    std::vector<std::pair<double, double>> pass_s;
    for (const PipelineStage& stage : layout_.stages()) pass_s.push_back(stage_pass_s(0, stage));
    std::vector<RankSync> sync(sim_ranks_.size());
    for (int sim = 0; with_sync && sim < static_cast<int>(sim_ranks_.size()); ++sim) {
      auto price = [&](const Op& op) -> std::optional<double> {
        return pricer_.price(op, groups_->lookup(sim, op.group).placement).time_s;
      };
      const int pp_rank = grid_.dense_coordinates(sim_ranks_[sim]).pp;
      sync[sim] = *rank_sync(model_, shape_, config_, layout_.stages_of_rank(pp_rank), options_.step,
                             options_.cache, price);
    }
    return pipeline_lower_bound(layout_, config_.num_microbatches(), pass_s, sync);
  }

  // Per chunk of a rank: the pass costs and the backward's per-entry costs (StageParameters' reverse order).
  struct ChunkCosts {
    PassCost forward, backward;
    double weight_cast_s = 0.0;  // FP8: added to the chunk's first forward (micro-batch 0)
    std::vector<PassCost> forward_entries, backward_entries;  // per symbol, in forward / backward order
    std::int64_t forward_count = 0, backward_count = 0;
    // FSDP optim_grads_params: the exposed time of the forward's gathers, and of each backward entry's.
    double fsdp_forward_s = 0.0;
    std::vector<double> fsdp_backward_entry_s;
  };
  std::vector<ChunkCosts> chunk_costs(int sim, const std::vector<PipelineStage>& stages) {
    std::vector<ChunkCosts> chunks(stages.size());
    for (std::size_t c = 0; c < stages.size(); ++c) {
      int next_layer = stages[c].first_decoder_layer;
      const std::vector<layouts::LayerRecompute> variants = layouts::symbol_recompute(recompute_, stages[c]);
      for (std::size_t i = 0; i < stages[c].symbols.size(); ++i) {
        const LayerSymbol sym = stages[c].symbols[i];
        const bool moe = sym == LayerSymbol::kDecoder && model_.is_moe_layer(next_layer);
        if (sym == LayerSymbol::kDecoder) ++next_layer;
        const SymbolCosts& sc = symbol_costs(sim, sym, moe, variants[i]);
        chunks[c].forward.add(sc.forward);
        chunks[c].weight_cast_s += sc.weight_cast_s;
        chunks[c].forward_entries.push_back(sc.forward);
        chunks[c].backward.add(sc.backward);
        chunks[c].backward_entries.push_back(sc.backward);
      }
      std::reverse(chunks[c].backward_entries.begin(), chunks[c].backward_entries.end());
    }
    return chunks;
  }

  // Pass level: the rank's walk (layouts/schedule_walker.h) as tasks, one per pass or backward segment.
  class PassLevel {
   public:
    PassLevel(Builder& owner, int sim)
        : o_(owner),
          sim_(sim),
          local_(owner.groups_->local_group(sim)),
          tracing_(owner.options_.record_trace),
          step_(layouts::walk_rank_step(owner.model_, owner.config_, owner.sim_ranks_[sim],
                                        owner.options_.step)),
          chunks_(owner.chunk_costs(sim, step_.stages)) {
      if (o_.config_.shards_parameters()) fsdp_gather_costs();
    }

    RankBuild run() {
      if (o_.config_.overlap_param_gather) {
        // Hoisted to the start of the iteration, overlapping the first forwards.
        for (const layouts::StepItem& item : step_.items)
          if (item.kind == layouts::StepItemKind::kParamGather)
            for (const Op& op : item_ops(item))
              add(collective_task(op, TaskKind::kAsyncCollective), op.label.c_str(), "all_gather");
      }
      bool optimizing = false;
      for (const layouts::StepItem& item : step_.items) {
        switch (item.kind) {
          case layouts::StepItemKind::kP2p:
            p2p(item);
            break;
          case layouts::StepItemKind::kForward:
            forward(item);
            break;
          case layouts::StepItemKind::kBackward:
            backward(item);
            break;
          case layouts::StepItemKind::kGradBucket:
            grad_bucket(item);
            break;
          case layouts::StepItemKind::kOptimizer:
            if (!optimizing) start_optimizer();
            optimizing = true;
            for (const Op& op : item_ops(item)) optimizer_op(op);
            break;
          case layouts::StepItemKind::kParamGather:
            if (o_.config_.overlap_param_gather) break;
            for (const Op& op : item_ops(item)) optimizer_op(op);
            break;
        }
      }
      return std::move(b_);
    }

   private:
    std::vector<Op> item_ops(const layouts::StepItem& item) const {
      return layouts::step_item_ops(o_.model_, o_.config_, step_, item, o_.options_.step);
    }

    void add(SimTask t, const char* name, const char* category) {
      if (t.kind == TaskKind::kCollective && t.duration_s <= 0.0 && t.group == local_) return;
      b_.tasks.push_back(t);
      if (tracing_) {
        b_.names.push_back(name);
        b_.categories.push_back(category);
        b_.details.push_back(name);
      }
    }
    // The pass's compute, then its blocking communication as one local delay per category it moves.
    void add_pass(const PassCost& cost, const char* name) {
      add(SimTask{TaskKind::kCompute, cost.compute_s}, name, "pass");
      for (int c = 0; c < kCommCategoryCount; ++c) {
        if (cost.comm_by_category[c] <= 0.0) continue;
        SimTask comm{TaskKind::kCollective, cost.comm_by_category[c]};
        comm.group = local_;
        comm.category = static_cast<CommCategory>(c);
        add(comm, tracing_ ? (std::string(name) + " comm").c_str() : name, "comm");
      }
    }
    SimTask collective_task(const Op& op, TaskKind kind) {
      SimTask t{kind, o_.price(op, sim_)};
      t.group = o_.groups_->lookup(sim_, op.group).id;
      t.stream = static_cast<int>(op.stream);
      t.category = comm_category(op);
      tally(op.kind, t.duration_s);
      return t;
    }
    void tally(OpKind kind, double time_s) {
      b_.kinds[static_cast<int>(kind)].total_s += time_s;
      b_.kinds[static_cast<int>(kind)].count += 1;
    }

    void p2p(const layouts::StepItem& item) {
      for (const layouts::StepTransfer& t : item.transfers) {
        const bool is_send = t.direction == layouts::P2pDirection::kSend;
        const bool gradient = t.tensor == layouts::P2pTensor::kGradient;
        SimTask task{is_send ? TaskKind::kSend : TaskKind::kRecv};
        task.peer = o_.groups_->sim_index(t.peer_rank);
        task.tag = p2p_tag(gradient, t.microbatch, t.producer_stage);
        if (is_send) {
          task.duration_s = p2p_time(t);
          tally(OpKind::kSend, task.duration_s);
        }
        if (tracing_)
          std::snprintf(name_, sizeof name_, "%s %s mb%d c%d", is_send ? "send" : "recv",
                        gradient ? "grad" : "act", t.microbatch, t.chunk);
        add(task, name_, is_send ? "send" : "recv");
      }
    }
    // One transfer's time, priced once per peer.
    double p2p_time(const layouts::StepTransfer& t) {
      auto found = p2p_time_.find(t.peer_pp_rank);
      if (found != p2p_time_.end()) return found->second;
      Op op;
      op.kind = OpKind::kSend;
      op.role = t.tensor == layouts::P2pTensor::kGradient ? layouts::OpRole::kP2pGradient
                                                          : layouts::OpRole::kP2pActivation;
      op.bytes = step_.shape.p2p_bytes;
      op.group = CommGroup::kPipeline;
      op.group_size = o_.grid_.pp();
      op.peer_rank = t.peer_rank;
      return p2p_time_.emplace(t.peer_pp_rank, o_.price(op, sim_, 0)).first->second;
    }

    // FSDP optim_grads_params: per chunk, its buckets' gathers priced once and what the prefetch leaves
    // exposed (exposed_gather_s): in the forward behind the previous symbol's compute, in the backward behind
    // the previous entry's (the first entry's gather is exposed whole).
    void fsdp_gather_costs() {
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        ChunkCosts& cc = chunks_[c];
        const std::size_t n = cc.backward_entries.size();
        std::vector<double> gather_s(n, 0.0);  // per backward entry
        for (const layouts::GradBucket& b : step_.buckets[c]) {
          const Op op = layouts::fsdp_param_gather_op(b, OpPhase::kForward, 0);
          const double t = o_.price(op, sim_);
          gather_s.at(static_cast<std::size_t>(b.ready_after_entry)) += t;
        }
        double credit = 0.0;
        for (std::size_t i = 0; i < n; ++i) {  // forward order: entry n - 1 - i
          cc.fsdp_forward_s += exposed_gather_s(gather_s[n - 1 - i], credit);
          credit = cc.forward_entries[i].compute_s;
        }
        credit = 0.0;
        for (std::size_t e = 0; e < n; ++e) {
          cc.fsdp_backward_entry_s.push_back(exposed_gather_s(gather_s[e], credit));
          credit = cc.backward_entries[e].compute_s;
        }
      }
    }
    void fsdp_gathers(double exposed_s, const char* name) {
      if (exposed_s <= 0.0) return;
      SimTask t{TaskKind::kCollective, exposed_s};
      t.group = local_;
      t.category = CommCategory::kData;
      add(t, name, "fsdp_param_ag");
    }

    void forward(const layouts::StepItem& item) {
      if (tracing_) std::snprintf(name_, sizeof name_, "F%d.%d", item.microbatch, item.chunk);
      ChunkCosts& cc = chunks_.at(item.chunk);
      fsdp_gathers(cc.fsdp_forward_s, "fsdp param gathers");
      if (item.microbatch == 0 && cc.weight_cast_s > 0.0) {
        add(SimTask{TaskKind::kCompute, cc.weight_cast_s}, "fp8 weight casts", "pass");
        tally(OpKind::kElementwise, cc.weight_cast_s);
      }
      add_pass(cc.forward, name_);
      ++cc.forward_count;
    }
    // A whole pass, or a segment of the chunk's last backward that ends where buckets become ready.
    void backward(const layouts::StepItem& item) {
      if (tracing_) std::snprintf(name_, sizeof name_, "B%d.%d", item.microbatch, item.chunk);
      ChunkCosts& cc = chunks_.at(item.chunk);
      if (item.entry_begin == 0) ++cc.backward_count;
      if (!cc.fsdp_backward_entry_s.empty()) {
        double exposed = 0.0;
        for (int e = item.entry_begin; e < item.entry_end; ++e) exposed += cc.fsdp_backward_entry_s.at(e);
        fsdp_gathers(exposed, "fsdp param gathers");
      }
      if (item.entry_begin == 0 && item.entry_end == item.entry_count) {
        add_pass(cc.backward, name_);
        return;
      }
      PassCost segment;
      for (int e = item.entry_begin; e < item.entry_end; ++e) segment.add(cc.backward_entries[e]);
      const bool trailing = item.entry_end == item.entry_count;  // no bucket follows it
      if (!trailing || segment.compute_s > 0 || segment.comm_s > 0) add_pass(segment, name_);
    }
    void grad_bucket(const layouts::StepItem& item) {
      const Op& op = step_.buckets.at(item.chunk).at(item.bucket).op;
      if (layouts::chunk_shards_gradients(o_.config_, step_.stages.at(item.chunk))) {
        // FSDP's sharded gradients: the bucket is reduce-scattered after its backward in every micro-batch
        // (the kernel level's ops of each backward), here launched together where the last one completes.
        for (int m = 0; m < o_.config_.num_microbatches(); ++m)
          add(collective_task(op, TaskKind::kAsyncCollective), op.label.c_str(),
              layouts::op_kind_name(op.kind));
        return;
      }
      if (o_.config_.overlap_grad_reduce)
        add(collective_task(op, TaskKind::kAsyncCollective), op.label.c_str(),
            layouts::op_kind_name(op.kind));
      else
        add(collective_task(op, TaskKind::kCollective), "grad sync", "grad_sync");
    }

    // After the schedule and the deferred buckets: the passes' op kinds, then the wait for every bucket.
    void start_optimizer() {
      for (const ChunkCosts& cc : chunks_) {
        for (int k = 0; k < kOpKindCount; ++k) {
          b_.kinds[k].total_s += cc.forward.kinds[k].total_s * cc.forward_count +
                                 cc.backward.kinds[k].total_s * cc.backward_count;
          b_.kinds[k].count +=
              cc.forward.kinds[k].count * cc.forward_count + cc.backward.kinds[k].count * cc.backward_count;
        }
      }
      add(SimTask{TaskKind::kWaitComm}, "wait grad sync", "wait");
    }
    void optimizer_op(const Op& op) {
      if (op.is_communication()) {
        add(collective_task(op, TaskKind::kCollective), op.label.c_str(), layouts::op_kind_name(op.kind));
        return;
      }
      const double t = o_.price(op, sim_);
      tally(op.kind, t);
      add(SimTask{TaskKind::kCompute, t}, op.label.c_str(), layouts::op_kind_name(op.kind));
    }

    Builder& o_;
    int sim_, local_;
    bool tracing_;
    layouts::RankStep step_;
    std::vector<ChunkCosts> chunks_;
    RankBuild b_;
    std::unordered_map<int, double> p2p_time_;  // by peer pp rank
    char name_[64] = "";
  };

  RankBuild build_pass_level(int sim) { return PassLevel(*this, sim).run(); }

 private:
  const layouts::ModelSpec& model_;
  const layouts::ParallelConfig& config_;
  const OpPricer& pricer_;
  const SimulationOptions& options_;
  SimulationResult& result_;
  layouts::RankGrid grid_;
  std::shared_ptr<const layouts::PipelineLayout> layout_holder_;
  const layouts::PipelineLayout& layout_;
  layouts::RankShape shape_;
  layouts::RecomputeSettings recompute_;  // the chunks' recompute plans (symbol variants)
  std::vector<int> sim_ranks_;
  std::unique_ptr<GroupMap> groups_;
  cost_models::Provenance last_provenance_ = cost_models::Provenance::kAnalytic;
  // Symbol costs are the same for every representative (their groups have the same shape and placement).
  std::unordered_map<int, SymbolCosts> symbol_cache_;
  std::optional<PassPlacements> pass_placements_;  // with options_.cache
};

}  // namespace

SimulationResult simulate(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const OpPricer& pricer, const SimulationOptions& options) {
  SimulationResult result;
  SimulationOptions effective = options;
  if (effective.all_ranks) effective.granularity = SimulationGranularity::kKernel;
  Builder builder(model, config, pricer, effective, result);
  const auto& sim_ranks = builder.sim_ranks();
  std::vector<RankBuild> builds;
  builds.reserve(sim_ranks.size());
  for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
    builds.push_back(effective.granularity == SimulationGranularity::kKernel ? builder.build_kernel_level(sim)
                                                                             : builder.build_pass_level(sim));
  }
  EngineInput input;
  input.record_timeline = effective.record_trace || effective.record_op_timeline;
  for (RankBuild& b : builds) input.programs.push_back(std::move(b.tasks));
  input.group_member_count = builder.groups().member_counts();
  EngineResult replayed = replay(input);

  summarize_replay(model, config, pricer.peak_bf16_tflops(), builder.grid(), sim_ranks, replayed, builds,
                   result);

  if (effective.record_op_timeline && effective.granularity == SimulationGranularity::kKernel) {
    for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
      RankOpTimeline& out = result.op_timelines.emplace_back();
      out.rank = sim_ranks[sim];
      for (std::size_t i = 0; i < input.programs[sim].size(); ++i) {
        const int id = input.programs[sim][i].op_index;
        if (id < 0) continue;
        if (id >= static_cast<int>(out.ops.size())) out.ops.resize(id + 1);
        out.ops[id] = {replayed.ranks[sim].timeline[i].start_s, replayed.ranks[sim].timeline[i].end_s};
      }
    }
  }
  if (effective.record_trace)
    append_trace_events(builder.grid(), sim_ranks, input.programs, replayed, builds, result);
  return result;
}

double step_time_lower_bound(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                             const OpPricer& pricer, const SimulationOptions& options, BoundTerms terms) {
  const bool with_sync = terms == BoundTerms::kPassesAndGradientSync;
  if (options.cache != nullptr)
    if (const std::optional<double> bound =
            cached_lower_bound(model, config, pricer, options.step, *options.cache, with_sync))
      return *bound;
  SimulationResult scratch;
  SimulationOptions pass_level = options;  // the passes simulate() prices at its planner granularity
  pass_level.granularity = SimulationGranularity::kPass;
  pass_level.all_ranks = false;
  pass_level.record_trace = pass_level.record_op_timeline = false;
  Builder builder(model, config, pricer, pass_level, scratch);
  return builder.lower_bound(with_sync);
}

}  // namespace megatune::planner
