// Memory model: parameters from the step program's stage parameters, activations from the saved tensors
// of each layer kind times the microbatches in flight under the schedule.
#include "planner/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "layouts/recompute_plan.h"
#include "layouts/schedule.h"

namespace megatune::planner {

using layouts::LayerSymbol;
using layouts::PipelineStage;
using layouts::RankShape;
using layouts::RecomputeGranularity;

namespace {

bool dropout_on(const layouts::ModelSpec& model, const MemoryOptions& options) {
  if (options.hidden_dropout >= 0) return options.hidden_dropout > 0;
  return model.normalization == layouts::Normalization::kLayerNorm;
}

// Saved by the attention block of one layer (input norm included), bytes.
std::int64_t attention_block_bytes(const RankShape& s, bool dropout, const MemoryOptions& options) {
  const std::int64_t sb = s.tokens;  // (s/cp) * b
  const std::int64_t sp_div = s.sp ? s.tp : 1;
  const std::int64_t h = s.hidden;
  std::int64_t bytes = 2 * sb * h / sp_div    // norm input
                       + 2 * sb * h / sp_div  // QKV GEMM input (sharded under SP, re-gathered)
                       + 2 * sb * (s.heads_per_rank() + 2 * s.groups_per_rank()) * s.head_dim  // Q, K, V
                       + 2 * sb * s.heads_per_rank() * s.head_dim;  // attention output
  // --qk-layernorm: the head norms' inputs (Q and K before their norms).
  if (s.qk_norm) bytes += 2 * sb * (s.heads_per_rank() + s.groups_per_rank()) * s.head_dim;
  if (options.flash_attention) {
    bytes += 4 * sb * s.heads_per_rank();  // log-sum-exp
  } else if (s.recompute != RecomputeGranularity::kSelective) {
    // Scores, softmax (2 bytes each) and attention-dropout mask (1 byte): 5 a s^2 b / t (per CP chunk).
    bytes += 5 * s.heads_per_rank() * s.seq_local * s.seq * s.micro_batch;
  }
  if (dropout) bytes += sb * h / sp_div;
  return bytes;
}

// ffn: the MLP's ffn on one TP rank.
std::int64_t dense_mlp_bytes(const RankShape& s, std::int64_t ffn, bool dropout, bool with_norm) {
  const std::int64_t sb = s.tokens;
  const std::int64_t sp_div = s.sp ? s.tp : 1;
  const std::int64_t glu = s.swiglu ? 2 : 1;
  std::int64_t bytes = 2 * sb * glu * ffn  // fc1 output = activation input
                       + 2 * sb * ffn;     // activation output = fc2 input
  if (with_norm) bytes += 2 * sb * s.hidden / sp_div + 2 * sb * s.hidden / sp_div;  // norm input, fc1 input
  if (dropout) bytes += sb * s.hidden / sp_div;
  return bytes;
}

std::int64_t moe_mlp_bytes(const RankShape& s, bool dropout) {
  const std::int64_t sp_div = s.sp ? s.tp : 1;
  const std::int64_t local_tokens = s.tokens / s.tp;
  const std::int64_t glu = s.swiglu ? 2 : 1;
  // Rows at the experts: the rank's routed choices, gathered over the expert-tensor group (both dispatchers
  // bring a rank as many rows as it routes when the routing is balanced).
  const std::int64_t rows = local_tokens * s.topk * s.etp;
  std::int64_t bytes = 2 * s.tokens * s.hidden / sp_div         // norm input
                       + 2 * local_tokens * s.hidden            // router input
                       + 4 * local_tokens * s.experts           // router probs (fp32)
                       + 2 * local_tokens * s.topk * s.hidden   // permuted tokens
                       + 2 * rows * s.hidden                    // expert fc1 input
                       + 2 * rows * glu * s.moe_ffn / s.etp     // expert activation input
                       + 2 * rows * s.moe_ffn / s.etp           // expert fc2 input
                       + 2 * local_tokens * s.topk * s.hidden;  // expert output before unpermute
  if (s.shared_ffn > 0)
    bytes += dense_mlp_bytes(s, s.shared_ffn_per_rank(), false, false) + 2 * s.tokens * s.hidden / sp_div;
  if (dropout) bytes += s.tokens * s.hidden / sp_div;
  return bytes;
}

std::int64_t layer_full_bytes(const layouts::ModelSpec& model, const RankShape& s, bool moe,
                              const MemoryOptions& options) {
  const bool dropout = dropout_on(model, options);
  return attention_block_bytes(s, dropout, options) +
         (moe ? moe_mlp_bytes(s, dropout) : dense_mlp_bytes(s, s.ffn_per_rank(), dropout, true));
}

// Logits of one microbatch on the loss stage: bf16 logits (+ fp32 copy), bytes.
std::int64_t logits_bytes_per_microbatch(const RankShape& s, const MemoryOptions& options) {
  const std::int64_t per = s.tokens * s.vocab_per_rank();
  return per * (2 + (options.fp32_logits_copy ? 4 : 0));
}

}  // namespace

std::int64_t layer_activation_bytes(const layouts::ModelSpec& model, const RankShape& s, bool moe,
                                    const MemoryOptions& options) {
  if (s.recompute == RecomputeGranularity::kFull) {
    return 2 * s.tokens * s.hidden / (s.sp ? s.tp : 1);  // only the layer input
  }
  return layer_full_bytes(model, s, moe, options);
}

std::vector<int> in_flight_microbatches_per_chunk(const layouts::ParallelConfig& config, int vpp,
                                                  int pp_rank) {
  const int m = config.num_microbatches();
  const int p = config.pp();
  const int g = config.micro_batch_group_size();
  std::vector<int> counts(vpp, 0);
  const int warmup = layouts::warmup_forward_count(p, pp_rank, vpp, m, g);
  const int live = std::min(warmup + 1, m * vpp);
  if (vpp == 1) {
    counts[0] = live;
    return counts;
  }
  for (int k = 0; k < live; ++k) ++counts[layouts::interleaved_schedule_entry(k, m, vpp, g).chunk];
  return counts;
}

MemoryItem device_buffers(const RankShape& s, const MemoryOptions& options) {
  int groups = 0;
  for (int size : {s.tp, s.cp, s.dp * s.cp, s.pp, s.ep, s.etp, s.edp}) groups += size > 1 ? 1 : 0;
  const std::int64_t bytes = options.cuda_context_bytes + options.cublas_workspace_bytes +
                             groups * options.nccl_buffer_bytes_per_group + (s.pp > 1 ? 4 * s.p2p_bytes : 0);
  return {"buffers", bytes,
          "CUDA context, cuBLAS workspace, NCCL (" + std::to_string(groups) + " groups), p2p"};
}

namespace {

// A rank's parameters over its chunks, as add_parameter_state counts their state.
struct StateParameters {
  std::int64_t dense = 0, expert = 0;
  std::int64_t largest_entry = 0;  // optim_grads_params: the largest parameter entry (elements)
  int gathered_entries = 2;        // optim_grads_params: the entries gathered at once
  // Sharded gradients: the largest bucket of the chunks that shard them (0: no chunk does).
  std::int64_t largest_bucket = 0;
  // Under sharded gradients, the parameters of the chunks that keep whole gradients (MTP).
  std::int64_t whole_grad_dense = 0, whole_grad_expert = 0;
};

// Megatron's bytes per parameter by sharding (d = dp x cp for dense parameters, expert-dp for experts):
// no_shard 2 + 4 + 12, optim (the distributed optimizer) 2 + 4 + 12/d, FSDP optim_grads 2 + (4 + 12)/d,
// optim_grads_params 18/d plus the gathered bf16 parameters of the two largest entries in flight (the
// layer being computed and the prefetched next one); with sharded gradients the whole-bucket gradient
// slots of the largest bucket (layouts::kFsdpGradientBucketsInFlight: the bucket being back-propagated and
// the one being reduce-scattered).
void add_parameter_state(MemoryEstimate& e, const layouts::ParallelConfig& config, const RankShape& s,
                         const StateParameters& p, const MemoryOptions& options) {
  const auto sharded_of = [&](bool shard, std::int64_t bytes_per_param, std::int64_t dense,
                              std::int64_t expert) {
    const std::int64_t d = shard ? s.dp * s.cp : 1, ed = shard ? s.edp : 1;
    return bytes_per_param * ((dense + d - 1) / d + (expert + ed - 1) / ed);
  };
  const auto sharded = [&](bool shard, std::int64_t bytes_per_param) {
    return sharded_of(shard, bytes_per_param, p.dense, p.expert);
  };
  const bool params = config.shards_parameters(), grads = p.largest_bucket > 0;
  const std::int64_t grad_bytes = options.grad_reduce_in_bf16 ? 2 : 4;
  e.weight_bytes = sharded(params, 2) + (params ? 2 * p.gathered_entries * p.largest_entry : 0);
  const int grad_slots = grads ? layouts::kFsdpGradientBucketsInFlight : 0;
  // The chunks that keep whole gradients (layouts::chunk_shards_gradients: MTP) count every element.
  e.gradient_bytes =
      sharded_of(grads, grad_bytes, p.dense - p.whole_grad_dense, p.expert - p.whole_grad_expert) +
      grad_bytes * (p.whole_grad_dense + p.whole_grad_expert) + grad_slots * p.largest_bucket * grad_bytes;
  e.optimizer_bytes = sharded(config.shards_optimizer_state(), 12);
  const std::string over = " sharded over dp*cp (experts: edp)";
  e.items.push_back({"weights (bf16)", e.weight_bytes,
                     std::to_string(e.parameters) + " params x 2 B" +
                         (params ? over + " + " + std::to_string(p.gathered_entries) +
                                       " gathered entries of " + std::to_string(p.largest_entry)
                                 : "")});
  e.items.push_back(
      {"gradients", e.gradient_bytes,
       std::string(options.grad_reduce_in_bf16 ? "bf16 grad buffer" : "fp32 main-grad buffer, 4 B/param") +
           (grads ? over + " + " + std::to_string(grad_slots) + " bucket slots of " +
                        std::to_string(p.largest_bucket) +
                        (p.whole_grad_dense + p.whole_grad_expert > 0
                             ? ", the MTP chunk's " +
                                   std::to_string(p.whole_grad_dense + p.whole_grad_expert) + " whole"
                             : "")
                  : "")});
  e.items.push_back(
      {"optimizer state", e.optimizer_bytes,
       config.shards_optimizer_state() ? "12 B/param" + over : "12 B/param: fp32 master + Adam m, v"});
}

// The FP8 bytes of a rank's stages (estimate_memory): 2 B per dense linear weight, 2 B per element of the
// widest input and output-gradient casts.
std::int64_t fp8_linear_bytes(const layouts::ModelSpec& model, const RankShape& s,
                              const std::vector<const PipelineStage*>& stages) {
  const std::int64_t attention = s.mla ? 0 : s.qkv_width() * s.hidden + s.hidden * s.attention_width();
  const std::int64_t mlp = s.fc1_width() * s.hidden + s.hidden * s.ffn_per_rank();
  std::int64_t weights = 0;
  for (const PipelineStage* stage : stages)
    for (int l = stage->first_decoder_layer; l < stage->first_decoder_layer + stage->num_decoder_layers; ++l)
      weights += attention + (model.is_moe_layer(l) ? 0 : mlp);
  if (weights == 0) return 0;
  const std::int64_t widest_in = std::max({s.hidden, s.attention_width(), s.ffn_per_rank()});
  const std::int64_t widest_out = std::max({s.hidden, s.qkv_width(), s.fc1_width()});
  return 2 * weights + 2 * s.tokens * (widest_in + widest_out);
}
}  // namespace

MemoryEstimate estimate_memory(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                               int pp_rank, const MemoryOptions& options) {
  MemoryEstimate e;
  e.pp_rank = pp_rank;
  const RankShape s = layouts::resolve_rank_shape(model, config);
  const layouts::PipelineLayout layout = config.resolved_pipeline_layout(model);
  const auto stages = layout.stages_of_rank(pp_rank);
  const int vpp = static_cast<int>(stages.size());

  // Parameters, gradients, optimizer state.
  StateParameters state;
  for (const PipelineStage* stage : stages) {
    if (config.shards_parameters())
      state.gathered_entries = std::max(
          state.gathered_entries,
          layouts::fsdp_gathered_entries(
              layouts::plan_recompute(s.recompute_settings(), *stage).largest_unit(),
              !model.untie_embeddings_and_output_weights && stage->has_embedding && stage->has_loss));
    layouts::StageParameters p = layouts::stage_parameters(model, s, *stage);
    state.dense += p.dense;
    state.expert += p.expert;
    for (std::size_t i = 0; i < p.layer_reverse.size(); ++i)
      state.largest_entry =
          std::max(state.largest_entry, p.dense_per_layer_reverse[i] + p.expert_per_layer_reverse[i]);
    if (layouts::chunk_shards_gradients(config, *stage)) {
      state.largest_bucket =
          std::max(state.largest_bucket, layouts::largest_grad_bucket_elements(s, config, p, options.step));
    } else {
      state.whole_grad_dense += p.dense;
      state.whole_grad_expert += p.expert;
    }
  }
  e.parameters = state.dense + state.expert;
  add_parameter_state(e, config, s, state, options);

  // Activations of the in-flight microbatches of each chunk. Under full recomputation the chunk's plan
  // (layouts/recompute_plan.h) decides: a unit saves its input once, a kept layer all it would save.
  e.in_flight_per_chunk = in_flight_microbatches_per_chunk(config, vpp, pp_rank);
  const bool dropout = dropout_on(model, options);
  const std::int64_t layer_input = 2 * s.tokens * s.hidden / (s.sp ? s.tp : 1);
  const layouts::RecomputeSettings recompute_settings = s.recompute_settings();
  std::int64_t largest_unit_full = 0;  // the activations one unit's re-run materializes
  int recomputed = 0, units = 0, layers = 0;
  for (int c = 0; c < vpp; ++c) {
    const PipelineStage& stage = *stages[c];
    std::int64_t unit_full = 0;  // of the unit being walked
    // The bytes a layer saves per the chunk's recompute plan (layouts::plan_recompute's rule, per layer);
    // `starts_unit`: it opens its unit (a unit saves its input once).
    const auto saved = [&](layouts::LayerRecompute r, bool starts_unit, bool moe) {
      const std::int64_t full = layer_full_bytes(model, s, moe, options);
      ++layers;
      if (r == layouts::LayerRecompute::kKept) return full;
      ++recomputed;
      unit_full += full;
      if (r == layouts::LayerRecompute::kUnitLast) {
        ++units;
        largest_unit_full = std::max(largest_unit_full, unit_full);
        unit_full = 0;
      }
      return starts_unit ? layer_input : std::int64_t{0};
    };
    std::int64_t per_microbatch = 0, logits = 0;
    int next_layer = stage.first_decoder_layer, position = 0;
    layouts::LayerRecompute previous = layouts::LayerRecompute::kUnitLast;  // a unit starts after one ends
    for (LayerSymbol sym : stage.symbols) {
      switch (sym) {
        case LayerSymbol::kEmbedding:
          per_microbatch += 8 * s.tokens + (dropout ? s.tokens * s.hidden / (s.sp ? s.tp : 1) : 0);
          break;
        case LayerSymbol::kDecoder: {
          const layouts::LayerRecompute r =
              layouts::decoder_layer_recompute(recompute_settings, position++, stage.num_decoder_layers);
          per_microbatch +=
              saved(r, previous != layouts::LayerRecompute::kUnitInner, model.is_moe_layer(next_layer++));
          previous = r;
          break;
        }
        case LayerSymbol::kMtp:
          per_microbatch +=
              saved(layouts::mtp_layer_recompute(recompute_settings), true, model.mtp_layer_is_moe()) +
              6 * s.tokens * s.hidden / (s.sp ? s.tp : 1);
          logits += logits_bytes_per_microbatch(s, options);
          break;
        case LayerSymbol::kLoss:
          per_microbatch += 2 * s.tokens * s.hidden / (s.sp ? s.tp : 1) + 2 * s.tokens * s.hidden;
          logits += logits_bytes_per_microbatch(s, options);
          break;
      }
    }
    e.activation_bytes += per_microbatch * e.in_flight_per_chunk[c];
    e.logits_bytes += logits * e.in_flight_per_chunk[c];
  }
  std::ostringstream flight;
  for (int c = 0; c < vpp; ++c) flight << (c ? "," : "") << e.in_flight_per_chunk[c];
  std::string recompute = std::string(layouts::to_string(config.recompute_granularity));
  if (s.recompute == RecomputeGranularity::kFull)
    recompute += " (" + std::string(layouts::to_string(config.recompute_method)) + " " +
                 std::to_string(config.recompute_num_layers) + ": " + std::to_string(recomputed) + " of " +
                 std::to_string(layers) + " layers in " + std::to_string(units) + " units)";
  e.items.push_back({"activations", e.activation_bytes,
                     "in-flight microbatches per chunk: " + flight.str() + "; recompute " + recompute});
  if (e.logits_bytes > 0) {
    e.items.push_back(
        {"logits + loss", e.logits_bytes,
         options.fp32_logits_copy ? "bf16 logits + fp32 copy for cross entropy" : "bf16 logits"});
  }

  // Working set at the peak: the unit being recomputed (full: all its layers' activations at once) or a
  // gathered SP input, plus the gradient of the activations flowing back.
  e.transient_bytes = 2 * s.tokens * s.hidden * 2 + largest_unit_full;
  e.items.push_back({"transient working set", e.transient_bytes,
                     largest_unit_full > 0 ? "the largest recomputed unit + activation grads"
                                           : "activation grads + gathered input"});

  // FP8 linears (layouts/fp8.h): every dense attention's and MLP's weights in FP8 and transposed (2 B per
  // weight, Transformer Engine's weight cache and the executor's alike) and one shared cast of a linear's
  // input and of its output gradient, each with its transpose.
  const std::int64_t fp8_bytes = options.step.fp8.enabled() ? fp8_linear_bytes(model, s, stages) : 0;
  if (fp8_bytes > 0)
    e.items.push_back(
        {"FP8 weight copies + casts", fp8_bytes, "weights and transposes at 1 B, cast buffers"});

  // Buffers.
  const MemoryItem buffers = device_buffers(s, options);
  e.buffer_bytes = buffers.bytes;
  e.items.push_back(buffers);
  const std::int64_t allocated = e.weight_bytes + e.gradient_bytes + e.optimizer_bytes + e.activation_bytes +
                                 e.logits_bytes + e.transient_bytes + fp8_bytes;
  e.fragmentation_bytes = static_cast<std::int64_t>(options.fragmentation_fraction * allocated);
  e.items.push_back({"allocator fragmentation", e.fragmentation_bytes,
                     std::to_string(static_cast<int>(options.fragmentation_fraction * 100)) + "% margin"});
  e.total_bytes = allocated + e.buffer_bytes + e.fragmentation_bytes;
  return e;
}

MemoryEstimate peak_memory(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                           const MemoryOptions& options) {
  MemoryEstimate best;
  for (int r = 0; r < config.pp(); ++r) {
    MemoryEstimate e = estimate_memory(model, config, r, options);
    if (r == 0 || e.total_bytes > best.total_bytes) best = std::move(e);
  }
  return best;
}

const char* memory_model_name(MemoryModelKind kind) {
  return kind == MemoryModelKind::kMegatune ? "megatune" : "megatron";
}

std::string format_bytes(double bytes) {
  char buf[32];
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (bytes >= gib)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / gib);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string MemoryEstimate::itemize() const {
  std::ostringstream out;
  out << "memory of pp rank " << pp_rank << ":\n";
  int width = 26;
  for (const MemoryItem& item : items) width = std::max(width, static_cast<int>(item.name.size()));
  for (const MemoryItem& item : items) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-*s %12s  %s\n", width, item.name.c_str(),
                  format_bytes(item.bytes).c_str(), item.detail.c_str());
    out << line;
  }
  char line[256];
  std::snprintf(line, sizeof line, "  %-*s %12s\n", width, "total", format_bytes(total_bytes).c_str());
  out << line;
  return out.str();
}

}  // namespace megatune::planner
