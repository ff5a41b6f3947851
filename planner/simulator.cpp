// Step simulator: builds per-rank task lists (per op, or per pass with ops priced once per layer kind),
// maps communication onto engine groups, replays them and summarizes.
#include "planner/simulator.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_map>

#include "layouts/flops.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule.h"
#include "planner/event_engine.h"

namespace megatune::planner {

using layouts::CommGroup;
using layouts::GroupKind;
using layouts::LayerSymbol;
using layouts::Op;
using layouts::OpKind;
using layouts::OpPhase;
using layouts::PipelineStage;

namespace {

bool is_cp_ring(const Op& op) {
  return (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) && op.group == CommGroup::kContext;
}

GroupKind group_kind(CommGroup group) {
  switch (group) {
    case CommGroup::kTensor:
      return GroupKind::kTp;
    case CommGroup::kContext:
      return GroupKind::kCp;
    case CommGroup::kData:
      return GroupKind::kDp;
    case CommGroup::kDataContext:
      return GroupKind::kDpCp;
    case CommGroup::kPipeline:
      return GroupKind::kPp;
    case CommGroup::kExpert:
      return GroupKind::kEp;
    case CommGroup::kExpertTensor:
      return GroupKind::kExpertTp;
    case CommGroup::kExpertData:
      return GroupKind::kExpertDp;
    case CommGroup::kTensorExpert:
      return GroupKind::kTpEp;
    case CommGroup::kEmbedding:
      return GroupKind::kEmbedding;
    default:
      return GroupKind::kTp;
  }
}

// Engine group ids of (simulated rank, comm group), the placement of each group on the cluster, and
// the count of simulated members.
class GroupMap {
 public:
  GroupMap(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks, int gpus_per_node)
      : grid_(grid), sim_ranks_(sim_ranks), gpus_per_node_(gpus_per_node) {
    for (int i = 0; i < static_cast<int>(sim_ranks.size()); ++i) sim_index_[sim_ranks[i]] = i;
  }

  int sim_index(int rank) const {
    auto it = sim_index_.find(rank);
    return it == sim_index_.end() ? -1 : it->second;
  }

  struct Entry {
    int id = -1;
    cost_models::CollectiveGroup placement;
  };

  const Entry& lookup(int sim, CommGroup group) {
    auto key = std::make_pair(sim, group);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const int rank = sim_ranks_[sim];
    std::vector<int> members;
    if (group == CommGroup::kWorld) {
      members.resize(grid_.world_size());
      for (int r = 0; r < grid_.world_size(); ++r) members[r] = r;
    } else if (group == CommGroup::kNone) {
      members = {rank};
    } else {
      members = grid_.group_of(rank, group_kind(group));
      if (members.empty()) members = {rank};
    }
    Entry e;
    e.placement = cost_models::collective_group_of(members, gpus_per_node_);
    auto canonical =
        std::make_pair(static_cast<int>(group), *std::min_element(members.begin(), members.end()));
    auto found = ids_.find(canonical);
    if (found == ids_.end()) {
      int simulated = 0;
      for (int m : members) simulated += sim_index_.count(m) ? 1 : 0;
      found = ids_.emplace(canonical, static_cast<int>(member_counts_.size())).first;
      member_counts_.push_back(simulated);
    }
    e.id = found->second;
    return cache_.emplace(key, e).first->second;
  }
  // A group holding only this simulated rank: a pure delay on its compute stream.
  int local_group(int sim) {
    auto it = local_.find(sim);
    if (it != local_.end()) return it->second;
    int id = static_cast<int>(member_counts_.size());
    member_counts_.push_back(1);
    local_[sim] = id;
    return id;
  }
  const std::vector<int>& member_counts() const { return member_counts_; }

 private:
  const layouts::RankGrid& grid_;
  const std::vector<int>& sim_ranks_;
  int gpus_per_node_;
  std::unordered_map<int, int> sim_index_;
  std::map<std::pair<int, CommGroup>, Entry> cache_;
  std::map<std::pair<int, int>, int> ids_;
  std::unordered_map<int, int> local_;
  std::vector<int> member_counts_;
};

// p2p tag: (tensor, microbatch, producer stage).
std::int64_t p2p_tag(bool gradient, int microbatch, int producer_stage) {
  return (static_cast<std::int64_t>(gradient) << 40) | (static_cast<std::int64_t>(microbatch) << 20) |
         static_cast<std::int64_t>(producer_stage);
}

struct RankBuild {
  std::vector<SimTask> tasks;
  std::vector<std::string> names;       // per task, when tracing
  std::vector<std::string> categories;  // per task, when tracing
  std::vector<std::string> details;     // per task, when tracing
  std::vector<const char*> provenance;  // per task, when tracing (kernel level)
  std::array<KindTime, kOpKindCount> kinds{};
};

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
        layout_(config.resolved_pipeline_layout(model)),
        shape_(layouts::resolve_step_shape(model, config)) {
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
        int peer = op.peer_rank >= 0 ? op.peer_rank : sim_ranks_[sim];
        placement = cost_models::collective_group_of({sim_ranks_[sim], peer}, pricer_.gpus_per_node());
        if (is_cp_ring(op)) placement = groups_->lookup(sim, CommGroup::kContext).placement;
        placement.size = 2;
        placement.nodes = std::min(placement.nodes, 2);
      } else {
        placement = groups_->lookup(sim, op.group).placement;
      }
    }
    cost_models::OpCost cost = pricer_.price(op, placement);
    result_.provenance_counts[static_cast<int>(cost.provenance)] += occurrences;
    last_provenance_ = cost.provenance;
    return cost.time_s;
  }

  // Kernel level: every op of the rank's step program becomes a task.
  RankBuild build_kernel_level(int sim) {
    RankBuild b;
    const layouts::StepProgram program =
        layouts::build_step_program(model_, config_, sim_ranks_[sim], options_.step);
    const int pp_rank = program.coordinates.pp;
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
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const Op& op = program.ops[i];
      // A CP ring step is one transfer: priced on its send, its recv is free.
      const double t = op.kind == OpKind::kRecv ? 0.0 : price(op, sim);
      b.kinds[static_cast<int>(op.kind)].total_s += t;
      b.kinds[static_cast<int>(op.kind)].count += 1;
      if (is_cp_ring(op)) {
        ring_s += t;
        continue;
      }
      if (op.phase == OpPhase::kOptimizer && !waited) {
        add(SimTask{TaskKind::kWaitComm}, nullptr, "wait grad sync");
        waited = true;
      }
      SimTask task;
      task.duration_s = t;
      task.op_index = static_cast<int>(i);
      if (!op.is_communication()) {
        task.kind = TaskKind::kCompute;
        add(task, &op, op.label);
        if ((op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) && ring_s > 0) {
          // The KV ring overlaps the attention kernel; what it does not hide stalls the CP group.
          SimTask ring{TaskKind::kCollective, std::max(0.0, ring_s - t)};
          ring.group = groups_->lookup(sim, CommGroup::kContext).id;
          add(ring, &op, "cp ring (exposed)");
          ring_s = 0.0;
        }
        continue;
      }
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        const int peer_sim = groups_->sim_index(op.peer_rank);
        task.kind = op.kind == OpKind::kSend ? TaskKind::kSend : TaskKind::kRecv;
        task.peer = peer_sim;
        const bool gradient = op.label == "p2p_gradient";
        const int own_stage = op.chunk * grid_.pp() + pp_rank;
        const int producer =
            op.kind == OpKind::kSend ? own_stage : (gradient ? own_stage + 1 : own_stage - 1);
        task.tag = p2p_tag(gradient, op.microbatch, producer);
        add(task, &op, op.label);
        continue;
      }
      task.group = groups_->lookup(sim, op.group).id;
      const bool grad_sync = op.phase == OpPhase::kGradSync;
      const bool param_gather = op.label == "param_ag" || op.label == "expert_param_ag";
      if (param_gather && config_.overlap_param_gather) {
        task.kind = TaskKind::kAsyncCollective;
        param_gathers.push_back({task, i});
        continue;
      }
      task.kind =
          grad_sync && config_.overlap_grad_reduce ? TaskKind::kAsyncCollective : TaskKind::kCollective;
      add(task, &op, op.label);
    }
    if (!param_gathers.empty()) {
      // Issued at the start of the iteration on the comm stream, overlapping the first forwards.
      RankBuild hoisted;
      for (auto& [task, index] : param_gathers) {
        hoisted.tasks.push_back(task);
        if (options_.record_trace) {
          hoisted.names.push_back(program.ops[index].label);
          hoisted.categories.push_back(layouts::op_kind_name(program.ops[index].kind));
          hoisted.details.push_back(layouts::to_string(program.ops[index]));
          hoisted.provenance.push_back("-");
        }
      }
      b.tasks.insert(b.tasks.begin(), hoisted.tasks.begin(), hoisted.tasks.end());
      b.names.insert(b.names.begin(), hoisted.names.begin(), hoisted.names.end());
      b.categories.insert(b.categories.begin(), hoisted.categories.begin(), hoisted.categories.end());
      b.details.insert(b.details.begin(), hoisted.details.begin(), hoisted.details.end());
      b.provenance.insert(b.provenance.begin(), hoisted.provenance.begin(), hoisted.provenance.end());
    }
    return b;
  }

  // Pass level: ops of each layer kind priced once; one compute task (+ one local delay for its blocking
  // communication) per forward / backward pass.
  struct PassCost {
    double compute_s = 0.0, comm_s = 0.0;
    std::array<KindTime, kOpKindCount> kinds{};
  };
  struct SymbolCosts {
    PassCost forward, backward;
  };

  PassCost price_ops(const std::vector<Op>& ops, int sim) {
    PassCost c;
    double ring_s = 0.0;
    for (const Op& op : ops) {
      const double t = op.kind == OpKind::kRecv ? 0.0 : price(op, sim);
      c.kinds[static_cast<int>(op.kind)].total_s += t;
      c.kinds[static_cast<int>(op.kind)].count += 1;
      if (is_cp_ring(op)) {
        ring_s += t;
      } else if (op.is_communication()) {
        c.comm_s += t;
      } else {
        c.compute_s += t;
        if ((op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) && ring_s > 0) {
          c.comm_s += std::max(0.0, ring_s - t);
          ring_s = 0.0;
        }
      }
    }
    return c;
  }

  // Costs of one symbol (E, dense t, MoE t, m, L) for one microbatch on this rank.
  const SymbolCosts& symbol_costs(int sim, LayerSymbol symbol, bool moe) {
    const int key = static_cast<int>(symbol) * 2 + (moe ? 1 : 0);
    auto it = symbol_cache_.find(key);
    if (it != symbol_cache_.end()) return it->second;
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
    stage.has_embedding = symbol == LayerSymbol::kEmbedding;
    stage.has_loss = symbol == LayerSymbol::kLoss;
    SymbolCosts costs;
    costs.forward = price_ops(layouts::stage_forward_ops(model_, shape_, stage, 0, options_.step), sim);
    costs.backward = price_ops(layouts::stage_backward_ops(model_, shape_, stage, 0, options_.step), sim);
    return symbol_cache_.emplace(key, costs).first->second;
  }

  static void add_kinds(std::array<KindTime, kOpKindCount>& into,
                        const std::array<KindTime, kOpKindCount>& from) {
    for (int k = 0; k < kOpKindCount; ++k) {
      into[k].total_s += from[k].total_s;
      into[k].count += from[k].count;
    }
  }

  // Compute + blocking communication of every pass a stage runs, summed: no schedule can beat it.
  double stage_work_lower_bound(int sim) {
    const layouts::DenseCoordinates coords = grid_.dense_coordinates(sim_ranks_[sim]);
    const auto stages = layout_.stages_of_rank(coords.pp);
    double total = 0.0;
    for (const PipelineStage* stage : stages) {
      int next_layer = stage->first_decoder_layer;
      for (LayerSymbol sym : stage->symbols) {
        const bool moe = sym == LayerSymbol::kDecoder && model_.is_moe_layer(next_layer);
        if (sym == LayerSymbol::kDecoder) ++next_layer;
        const SymbolCosts& sc = symbol_costs(sim, sym, moe);
        total += sc.forward.compute_s + sc.forward.comm_s + sc.backward.compute_s + sc.backward.comm_s;
      }
    }
    return total * config_.num_microbatches();
  }

  RankBuild build_pass_level(int sim) {
    RankBuild b;
    const layouts::DenseCoordinates coords = grid_.dense_coordinates(sim_ranks_[sim]);
    const layouts::RankSchedule schedule = layouts::build_schedule(model_, config_, coords.pp);
    const auto stages = layout_.stages_of_rank(coords.pp);
    const int local = groups_->local_group(sim);

    // Per chunk: per-entry backward costs (reverse symbol order) and the pass totals.
    struct ChunkCosts {
      PassCost forward, backward;
      std::vector<PassCost> backward_entries;
      std::vector<layouts::GradBucket> buckets;
      std::int64_t forward_count = 0, backward_count = 0;
    };
    std::vector<ChunkCosts> chunks(stages.size());
    for (std::size_t c = 0; c < stages.size(); ++c) {
      const PipelineStage& stage = *stages[c];
      int next_layer = stage.first_decoder_layer;
      std::vector<PassCost> entries;
      for (LayerSymbol sym : stage.symbols) {
        const bool moe = sym == LayerSymbol::kDecoder && model_.is_moe_layer(next_layer);
        if (sym == LayerSymbol::kDecoder) ++next_layer;
        const SymbolCosts& sc = symbol_costs(sim, sym, moe);
        chunks[c].forward.compute_s += sc.forward.compute_s;
        chunks[c].forward.comm_s += sc.forward.comm_s;
        add_kinds(chunks[c].forward.kinds, sc.forward.kinds);
        chunks[c].backward.compute_s += sc.backward.compute_s;
        chunks[c].backward.comm_s += sc.backward.comm_s;
        add_kinds(chunks[c].backward.kinds, sc.backward.kinds);
        entries.push_back(sc.backward);
      }
      std::reverse(entries.begin(), entries.end());
      chunks[c].backward_entries = std::move(entries);
      chunks[c].buckets =
          layouts::grad_sync_buckets(shape_, config_, layouts::stage_parameters(model_, shape_, stage),
                                     static_cast<int>(c), options_.step);
    }
    std::vector<int> last_backward(stages.size(), -1);
    for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i)
      if (schedule.items[i].kind == layouts::ScheduleItemKind::kBackward)
        last_backward[schedule.items[i].chunk] = i;

    const bool tracing = options_.record_trace;
    auto add = [&](SimTask t, const char* name, const char* category) {
      if (t.kind == TaskKind::kCollective && t.duration_s <= 0.0 && t.group == local) return;
      b.tasks.push_back(t);
      if (tracing) {
        b.names.push_back(name);
        b.categories.push_back(category);
        b.details.push_back(name);
      }
    };
    auto add_pass = [&](const PassCost& cost, const char* name) {
      add(SimTask{TaskKind::kCompute, cost.compute_s}, name, "pass");
      if (cost.comm_s > 0.0) {
        SimTask comm{TaskKind::kCollective, cost.comm_s};
        comm.group = local;
        add(comm, tracing ? (std::string(name) + " comm").c_str() : name, "comm");
      }
    };
    // Param all-gathers hoisted to the start with overlap_param_gather.
    std::vector<Op> optimizer_ops =
        layouts::optimizer_step_ops(model_, shape_, config_, stages, options_.step);
    std::vector<SimTask> deferred_sync;
    auto collective_task = [&](const Op& op, TaskKind kind) {
      SimTask t{kind, price(op, sim)};
      t.group = groups_->lookup(sim, op.group).id;
      b.kinds[static_cast<int>(op.kind)].total_s += t.duration_s;
      b.kinds[static_cast<int>(op.kind)].count += 1;
      return t;
    };
    if (config_.overlap_param_gather) {
      for (const Op& op : optimizer_ops)
        if (op.label == "param_ag" || op.label == "expert_param_ag")
          add(collective_task(op, TaskKind::kAsyncCollective), op.label.c_str(), "all_gather");
    }
    Op p2p_op;
    p2p_op.kind = OpKind::kSend;
    p2p_op.bytes = shape_.p2p_bytes;
    p2p_op.group = CommGroup::kPipeline;
    p2p_op.group_size = grid_.pp();
    std::unordered_map<int, double> p2p_time;  // by peer pp rank
    char name[64] = "";
    for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
      const layouts::ScheduleItem& item = schedule.items[i];
      if (item.kind == layouts::ScheduleItemKind::kP2p) {
        for (int pass = 0; pass < 2; ++pass) {
          for (const layouts::P2pTransfer& t : item.transfers) {
            const bool is_send = t.direction == layouts::P2pDirection::kSend;
            if (is_send != (pass == 0)) continue;
            layouts::DenseCoordinates peer = coords;
            peer.pp = t.peer_pp_rank;
            const int peer_rank = grid_.rank_of(peer);
            SimTask task{is_send ? TaskKind::kSend : TaskKind::kRecv};
            task.peer = groups_->sim_index(peer_rank);
            const bool gradient = t.tensor == layouts::P2pTensor::kGradient;
            const int own_stage = t.chunk * grid_.pp() + coords.pp;
            const int producer = is_send ? own_stage : (gradient ? own_stage + 1 : own_stage - 1);
            task.tag = p2p_tag(gradient, t.microbatch, producer);
            if (is_send) {
              auto found = p2p_time.find(t.peer_pp_rank);
              if (found == p2p_time.end()) {
                p2p_op.peer_rank = peer_rank;
                found = p2p_time.emplace(t.peer_pp_rank, price(p2p_op, sim, 0)).first;
              }
              task.duration_s = found->second;
              b.kinds[static_cast<int>(OpKind::kSend)].total_s += task.duration_s;
              b.kinds[static_cast<int>(OpKind::kSend)].count += 1;
            }
            if (tracing)
              std::snprintf(name, sizeof name, "%s %s mb%d c%d", is_send ? "send" : "recv",
                            gradient ? "grad" : "act", t.microbatch, t.chunk);
            add(task, name, is_send ? "send" : "recv");
          }
        }
        continue;
      }
      ChunkCosts& cc = chunks.at(item.chunk);
      if (item.kind == layouts::ScheduleItemKind::kForward) {
        if (tracing) std::snprintf(name, sizeof name, "F%d.%d", item.microbatch, item.chunk);
        add_pass(cc.forward, name);
        ++cc.forward_count;
        continue;
      }
      if (tracing) std::snprintf(name, sizeof name, "B%d.%d", item.microbatch, item.chunk);
      ++cc.backward_count;
      if (i != last_backward[item.chunk] || cc.buckets.empty()) {
        add_pass(cc.backward, name);
        continue;
      }
      // The last backward of the chunk: split at bucket boundaries and issue each bucket when ready.
      PassCost segment;
      std::size_t next_bucket = 0;
      for (int e = 0; e < static_cast<int>(cc.backward_entries.size()); ++e) {
        segment.compute_s += cc.backward_entries[e].compute_s;
        segment.comm_s += cc.backward_entries[e].comm_s;
        bool flushed = false;
        while (next_bucket < cc.buckets.size() && cc.buckets[next_bucket].ready_after_entry == e) {
          if (!flushed) {
            add_pass(segment, name);
            segment = PassCost{};
            flushed = true;
          }
          const Op& op = cc.buckets[next_bucket].op;
          if (config_.overlap_grad_reduce) {
            add(collective_task(op, TaskKind::kAsyncCollective), op.label.c_str(),
                layouts::op_kind_name(op.kind));
          } else {
            deferred_sync.push_back(collective_task(op, TaskKind::kCollective));
          }
          ++next_bucket;
        }
      }
      if (segment.compute_s > 0 || segment.comm_s > 0) add_pass(segment, name);
    }
    for (const ChunkCosts& cc : chunks) {
      for (int k = 0; k < kOpKindCount; ++k) {
        b.kinds[k].total_s +=
            cc.forward.kinds[k].total_s * cc.forward_count + cc.backward.kinds[k].total_s * cc.backward_count;
        b.kinds[k].count +=
            cc.forward.kinds[k].count * cc.forward_count + cc.backward.kinds[k].count * cc.backward_count;
      }
    }
    for (const SimTask& t : deferred_sync) add(t, "grad sync", "grad_sync");
    add(SimTask{TaskKind::kWaitComm}, "wait grad sync", "wait");
    for (const Op& op : optimizer_ops) {
      const bool param_gather = op.label == "param_ag" || op.label == "expert_param_ag";
      if (param_gather && config_.overlap_param_gather) continue;
      if (op.is_communication()) {
        add(collective_task(op, TaskKind::kCollective), op.label.c_str(), layouts::op_kind_name(op.kind));
      } else {
        const double t = price(op, sim);
        b.kinds[static_cast<int>(op.kind)].total_s += t;
        b.kinds[static_cast<int>(op.kind)].count += 1;
        add(SimTask{TaskKind::kCompute, t}, op.label.c_str(), layouts::op_kind_name(op.kind));
      }
    }
    return b;
  }

 private:
  const layouts::ModelSpec& model_;
  const layouts::ParallelConfig& config_;
  const OpPricer& pricer_;
  const SimulationOptions& options_;
  SimulationResult& result_;
  layouts::RankGrid grid_;
  layouts::PipelineLayout layout_;
  layouts::StepShape shape_;
  std::vector<int> sim_ranks_;
  std::unique_ptr<GroupMap> groups_;
  cost_models::Provenance last_provenance_ = cost_models::Provenance::kAnalytic;
  // Symbol costs are the same for every representative (their groups have the same shape and placement).
  std::unordered_map<int, SymbolCosts> symbol_cache_;
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

  result.simulated_ranks = static_cast<int>(sim_ranks.size());
  result.step_time_s = replayed.step_time_s;
  const int pp = config.pp();
  result.stages.resize(pp);
  std::vector<int> stage_sim(pp, -1);
  for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
    const int stage = builder.grid().dense_coordinates(sim_ranks[sim]).pp;
    if (stage_sim[stage] < 0 || replayed.ranks[sim].finish_s > replayed.ranks[stage_sim[stage]].finish_s)
      stage_sim[stage] = sim;
  }
  double bubble_sum = 0.0;
  int critical = 0;
  for (int s = 0; s < pp; ++s) {
    const RankReplay& r = replayed.ranks[stage_sim[s]];
    StageReport& report = result.stages[s];
    report.pp_rank = s;
    report.rank = sim_ranks[stage_sim[s]];
    report.finish_s = r.finish_s;
    report.compute_s = r.compute_busy_s;
    report.exposed_comm_s = r.exposed_comm_s;
    report.pipeline_wait_s = r.pipeline_wait_s;
    report.async_comm_s = r.async_comm_busy_s;
    const double working = r.compute_busy_s + r.exposed_comm_s;
    bubble_sum += working > 0 ? r.pipeline_wait_s / working : 0.0;
    if (r.finish_s > result.stages[critical].finish_s ||
        (r.finish_s == result.stages[critical].finish_s &&
         r.compute_busy_s > result.stages[critical].compute_s))
      critical = s;
  }
  result.bubble_fraction = bubble_sum / pp;
  result.critical_stage = critical;
  result.exposed_comm_s = result.stages[critical].exposed_comm_s;
  result.compute_s = result.stages[critical].compute_s;
  result.kind_times = builds[stage_sim[critical]].kinds;

  const std::int64_t gbs = config.resolved_global_batch_size();
  result.model_flops = layouts::model_flops_per_iteration(model, gbs, config.tp());
  if (result.step_time_s > 0) {
    result.mfu =
        layouts::mfu(result.model_flops, result.step_time_s, config.world_size, pricer.peak_bf16_tflops());
    result.tflops_per_gpu = result.model_flops / (result.step_time_s * config.world_size * 1e12);
    result.tokens_per_s = static_cast<double>(gbs) * model.seq_length / result.step_time_s;
  }

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
  if (effective.record_trace) {
    for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
      const int rank = sim_ranks[sim];
      const layouts::DenseCoordinates c = builder.grid().dense_coordinates(rank);
      char pname[96];
      std::snprintf(pname, sizeof pname, "rank %d (pp%d tp%d cp%d dp%d)", rank, c.pp, c.tp, c.cp, c.dp);
      result.trace_processes.push_back({rank, pname});
      const auto& tasks = input.programs[sim];
      const auto& timeline = replayed.ranks[sim].timeline;
      for (std::size_t i = 0; i < tasks.size(); ++i) {
        const double duration = timeline[i].end_s - timeline[i].start_s;
        if (duration <= 0.0 && tasks[i].kind != TaskKind::kCompute) continue;
        TraceEvent e;
        e.pid = rank;
        e.thread = tasks[i].kind == TaskKind::kAsyncCollective ? TraceThread::kComm
                   : tasks[i].kind == TaskKind::kSend          ? TraceThread::kP2p
                                                               : TraceThread::kCompute;
        e.name = builds[sim].names[i];
        e.category = builds[sim].categories[i];
        e.start_s = timeline[i].start_s;
        e.duration_s = duration;
        e.args.push_back({"op", builds[sim].details[i]});
        if (i < builds[sim].provenance.size()) e.args.push_back({"provenance", builds[sim].provenance[i]});
        if (tasks[i].kind == TaskKind::kRecv) e.args.push_back({"waited", "pipeline or transfer"});
        result.trace_events.push_back(std::move(e));
      }
    }
  }
  return result;
}

double step_time_lower_bound(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                             const OpPricer& pricer, const layouts::StepProgramOptions& step) {
  SimulationResult scratch;
  SimulationOptions options;
  options.step = step;
  Builder builder(model, config, pricer, options, scratch);
  double bound = 0.0;
  for (int sim = 0; sim < static_cast<int>(builder.sim_ranks().size()); ++sim)
    bound = std::max(bound, builder.stage_work_lower_bound(sim));
  return bound;
}

std::string SimulationResult::kind_table() const {
  std::vector<int> order;
  double total = 0.0;
  for (int k = 0; k < kOpKindCount; ++k) {
    if (kind_times[k].count > 0) order.push_back(k);
    total += kind_times[k].total_s;
  }
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return kind_times[a].total_s > kind_times[b].total_s; });
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "  %-16s %10s %12s %7s\n", "op kind", "count", "time (ms)", "share");
  out << line;
  for (int k : order) {
    std::snprintf(line, sizeof line, "  %-16s %10lld %12.3f %6.1f%%\n",
                  layouts::op_kind_name(static_cast<OpKind>(k)), static_cast<long long>(kind_times[k].count),
                  kind_times[k].total_s * 1e3, total > 0 ? 100.0 * kind_times[k].total_s / total : 0.0);
    out << line;
  }
  return out.str();
}

}  // namespace megatune::planner
