// Gradient synchronization and the optimizer step (declared in step_program.h): the parameters each stage
// holds, Megatron's gradient buckets over them, the distributed optimizer's param gathers and the ops of the
// post-schedule steps; FSDP's per-segment parameter gathers.
#include <algorithm>
#include <climits>
#include <numeric>

#include "layouts/grad_buffer_plan.h"
#include "layouts/op_sink.h"
#include "layouts/parameter_table.h"
#include "layouts/step_program.h"

namespace megatune::layouts {
namespace {

std::int64_t layer_dense_params(const ModelSpec& model, const RankShape& s, bool moe) {
  return attention_parameters(model, s.tp) + decoder_mlp_parameters(model, moe, s.tp);
}

std::int64_t layer_expert_params(const ModelSpec& model, const RankShape& s, bool moe) {
  return moe ? routed_expert_parameters(model, static_cast<int>(s.experts / s.ep), s.etp) : 0;
}

// The gradient-buffer elements of one stage entry: from the parameter table for dense GPT / Llama /
// DeepSeek-style entries, MLA and MTP layers included (each parameter padded to the buffer's alignment), the
// unpadded count for MoE layers (which the executor does not run yet).
std::int64_t buffer_elements(const ModelSpec& model, const RankShape& s, const PipelineStage& stage,
                             LayerSymbol symbol, int layer, std::int64_t dense) {
  if ((symbol == LayerSymbol::kDecoder && model.is_moe_layer(layer)) ||
      (symbol == LayerSymbol::kMtp && model.mtp_layer_is_moe()))
    return dense;
  StageContents contents;
  contents.num_layers = 0;
  if (symbol == LayerSymbol::kDecoder) {
    contents.first_layer = layer;
    contents.num_layers = 1;
  } else if (symbol == LayerSymbol::kMtp) {
    contents.first_mtp_layer = -3 - layer;
    contents.num_mtp_layers = 1;
  }
  contents.has_embedding = symbol == LayerSymbol::kEmbedding;
  contents.has_loss = symbol == LayerSymbol::kLoss;
  // The stage's own embedding copy of its MTP layers counts with its first m (none when it holds E).
  const bool mtp_copy = symbol == LayerSymbol::kMtp && !stage.has_embedding &&
                        contents.first_mtp_layer == stage.first_mtp_layer;
  std::int64_t n = 0;
  for (const ParameterSpec& p : stage_parameter_table(s, contents)) {
    if (p.layer <= -3 && p.name.rfind("embedding.", 0) == 0 && !mtp_copy) continue;
    // A tied head is the stage's own embedding table (counted with E, or with the MTP layers' copy) when the
    // stage holds one.
    const bool head_copy = p.layer == -2 && p.name == "embedding.word_embeddings.weight";
    if (!(head_copy && (stage.has_embedding || stage.num_mtp_layers > 0))) n += aligned_elements(p.numel());
  }
  return n;
}

}  // namespace

StageParameters stage_parameters(const ModelSpec& model, const RankShape& s, const PipelineStage& stage) {
  StageParameters p;
  const std::vector<int> layers = stage_symbol_layers(stage);
  for (std::size_t j = stage.symbols.size(); j-- > 0;) {
    std::int64_t dense = 0, expert = 0;
    switch (stage.symbols[j]) {
      case LayerSymbol::kEmbedding:
        dense = s.vocab_padded / s.tp * s.hidden;
        if (!s.rope) dense += static_cast<std::int64_t>(model.max_positions()) * s.hidden;
        break;
      case LayerSymbol::kDecoder: {
        const bool moe = model.is_moe_layer(layers[j]);
        dense = layer_dense_params(model, s, moe);
        expert = layer_expert_params(model, s, moe);
        // With MTP the final norm follows the last decoder layer (Megatron's placement).
        if (model.mtp_num_layers > 0 && layers[j] == model.num_layers - 1)
          dense += s.hidden * (s.rms ? 1 : 2);
        break;
      }
      case LayerSymbol::kMtp:
        dense = layer_dense_params(model, s, model.mtp_layer_is_moe()) + mtp_extra_parameters(model, s.tp);
        expert = layer_expert_params(model, s, model.mtp_layer_is_moe());
        // The first MTP layer of a stage without the embedding brings the stage's copy of it.
        if (!stage.has_embedding && -3 - layers[j] == stage.first_mtp_layer) {
          dense += s.vocab_padded / s.tp * s.hidden;
          if (!s.rope) dense += static_cast<std::int64_t>(model.max_positions()) * s.hidden;
        }
        break;
      case LayerSymbol::kLoss:
        if (model.mtp_num_layers == 0) dense = s.hidden * (s.rms ? 1 : 2);
        // Untied: the output layer. Tied with pp > 1: the last stage keeps its own copy of the embedding
        // (its MTP layers' copy when it has them).
        if (!s.tied || (!stage.has_embedding && stage.num_mtp_layers == 0))
          dense += s.vocab_padded / s.tp * s.hidden;
        break;
    }
    p.dense += dense;
    p.expert += expert;
    p.dense_buffer_per_layer_reverse.push_back(
        buffer_elements(model, s, stage, stage.symbols[j], layers[j], dense));
    p.dense_per_layer_reverse.push_back(dense);
    p.expert_per_layer_reverse.push_back(expert);
    p.layer_reverse.push_back(layers[j]);
  }
  return p;
}

namespace {

// A region's bucket before its collective: elements (padded to lcm(group size, 128) under the distributed
// optimizer, as the executor lays the buffer out) and the entry after which it is complete.
struct BucketFill {
  std::int64_t elements = 0;
  bool expert = false;
  int ready_after = 0;
};

// The elements a bucket holds before it closes (grad_bucket_limit over dp x cp). FSDP: buckets as with
// overlap_grad_reduce; with sharded parameters a bucket per parameter entry (Megatron FSDP's per-module
// unit), what one forward segment gathers and one entry's backward reduce-scatters.
std::int64_t bucket_limit_elements(const RankShape& shape, const ParallelConfig& config,
                                   const StepProgramOptions& options) {
  if (config.shards_parameters()) return 1;
  return grad_bucket_limit(options.bucket_size_elements, shape.dp * shape.cp,
                           config.overlap_grad_reduce || config.shards_gradients());
}

// Every bucket of the stage's two regions, whatever their group sizes, in the order they complete.
std::vector<BucketFill> bucket_fills(const RankShape& shape, const ParallelConfig& config,
                                     const StageParameters& parameters, const StepProgramOptions& options) {
  const int dense_group = shape.dp * shape.cp;
  const std::int64_t bucket_limit = bucket_limit_elements(shape, config, options);
  std::vector<BucketFill> fills;
  auto emit = [&](std::int64_t elements, bool expert, int ready_after) {
    if (elements <= 0) return;
    if (config.shards_optimizer_state()) {
      const std::int64_t multiple = std::lcm<std::int64_t>(expert ? shape.edp : dense_group, 128);
      elements = (elements + multiple - 1) / multiple * multiple;
    }
    fills.push_back({elements, expert, ready_after});
  };
  std::int64_t dense_fill = 0, expert_fill = 0;
  const int n = static_cast<int>(parameters.layer_reverse.size());
  for (int i = 0; i < n; ++i) {
    dense_fill += parameters.dense_buffer_per_layer_reverse.empty()
                      ? parameters.dense_per_layer_reverse[i]
                      : parameters.dense_buffer_per_layer_reverse[i];
    expert_fill += parameters.expert_per_layer_reverse[i];
    if (dense_fill >= bucket_limit) {
      emit(dense_fill, false, i);
      dense_fill = 0;
    }
    if (expert_fill >= bucket_limit) {
      emit(expert_fill, true, i);
      expert_fill = 0;
    }
  }
  emit(dense_fill, false, n - 1);
  emit(expert_fill, true, n - 1);
  return fills;
}

}  // namespace

std::vector<GradBucket> grad_sync_buckets(const RankShape& shape, const ParallelConfig& config,
                                          const StageParameters& parameters, int chunk,
                                          const StepProgramOptions& options) {
  std::vector<GradBucket> buckets;
  const std::int64_t grad_bytes = options.grad_reduce_in_bf16 ? 2 : 4;
  for (const BucketFill& fill : bucket_fills(shape, config, parameters, options)) {
    const int group_size = fill.expert ? shape.edp : shape.dp * shape.cp;
    if (group_size <= 1) continue;
    GradBucket b;
    b.op.kind = config.shards_optimizer_state() ? OpKind::kReduceScatter : OpKind::kAllReduce;
    b.op.phase = OpPhase::kGradSync;
    b.op.role = fill.expert ? OpRole::kExpertGradReduce : OpRole::kGradReduce;
    b.op.label = fill.expert ? "expert_grad_bucket" : "grad_bucket";
    b.op.dtype = grad_bytes == 2 ? DType::kBF16 : DType::kFP32;
    b.op.bytes = fill.elements * grad_bytes;
    b.op.group = fill.expert ? CommGroup::kExpertData : CommGroup::kDataContext;
    b.op.group_size = group_size;
    b.op.chunk = chunk;
    b.ready_after_entry = fill.ready_after;
    b.elements = fill.elements;
    b.expert = fill.expert;
    buckets.push_back(std::move(b));
  }
  return buckets;
}

std::int64_t largest_grad_bucket_elements(const RankShape& shape, const ParallelConfig& config,
                                          const StageParameters& parameters,
                                          const StepProgramOptions& options) {
  std::int64_t most = 0;
  for (const BucketFill& fill : bucket_fills(shape, config, parameters, options))
    most = std::max(most, fill.elements);
  return most;
}

std::int64_t sequence_parallel_grad_elements(const RankShape& shape, const ParallelConfig& config,
                                             const PipelineStage& stage, int data_context_rank,
                                             const StepProgramOptions& options) {
  const std::vector<ParameterSpec> table = stage_parameter_table(shape, contents_of(stage));
  std::int64_t elements = 0;
  if (!chunk_shards_gradients(config, stage)) {
    for (const ParameterSpec& p : table)
      if (p.sequence_parallel_grad) elements += p.numel();
    return elements;
  }
  // The dense region in buffer order (the reverse of the table's), laid out as the executor lays it.
  std::vector<GradBufferItem> items;
  std::vector<const ParameterSpec*> specs;
  for (std::size_t i = table.size(); i-- > 0;) {
    if (table[i].expert >= 0) continue;
    items.push_back({table[i].numel(), table[i].layer});
    specs.push_back(&table[i]);
  }
  const int group = shape.dp * shape.cp;
  const GradBufferPlan plan =
      plan_grad_buffer(items, bucket_limit_elements(shape, config, options),
                       grad_bucket_end_multiple(group, config.shards_optimizer_state()));
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i]->sequence_parallel_grad)
      elements += elements_in_grad_shards(plan, group, data_context_rank, plan.offsets[i],
                                          plan.offsets[i] + specs[i]->numel());
  return elements;
}

Op param_gather_op(const GradBucket& bucket) {
  Op op;
  op.kind = OpKind::kAllGather;
  op.phase = OpPhase::kOptimizer;
  op.role = bucket.expert ? OpRole::kExpertParamGather : OpRole::kParamGather;
  op.label = bucket.expert ? "expert_param_ag" : "param_ag";
  op.bytes = bucket.elements * 2;  // bf16 params
  op.group = bucket.op.group;
  op.group_size = bucket.op.group_size;
  op.chunk = bucket.op.chunk;
  return op;
}

bool chunk_shards_gradients(const ParallelConfig& config, const PipelineStage& stage) {
  return config.shards_gradients() && stage.num_mtp_layers == 0;
}

std::vector<Op> fsdp_grad_reduce_ops(const GradBucket& bucket, int microbatch) {
  std::vector<Op> ops{bucket.op};
  ops.back().microbatch = microbatch;
  if (microbatch == 0) return ops;
  Op add;
  add.kind = OpKind::kElementwise;
  add.phase = OpPhase::kGradSync;
  add.label = "fsdp_grad_accumulate";
  add.dtype = DType::kFP32;
  add.bytes = 3 * 4 * (bucket.elements / bucket.op.group_size);
  add.chunk = bucket.op.chunk;
  add.microbatch = microbatch;
  ops.push_back(add);
  return ops;
}

Op fsdp_param_gather_op(const GradBucket& bucket, OpPhase phase, int microbatch) {
  Op op = param_gather_op(bucket);
  op.phase = phase;
  op.role = bucket.expert ? OpRole::kFsdpExpertParamGather : OpRole::kFsdpParamGather;
  op.label = bucket.expert ? "fsdp_expert_param_ag" : "fsdp_param_ag";
  op.microbatch = microbatch;
  return op;
}

std::vector<Op> optimizer_step_ops(const ModelSpec& model, const RankShape& shape,
                                   const ParallelConfig& config, const std::vector<PipelineStage>& stages,
                                   OptimizerStep step, int data_context_rank,
                                   const StepProgramOptions& options) {
  std::vector<Op> ops;
  OpSink o(ops, OpPhase::kOptimizer, -1, -1, -1);
  const std::int64_t grad_bytes = options.grad_reduce_in_bf16 ? 2 : 4;
  switch (step) {
    case OptimizerStep::kEmbeddingGradReduce:
      // With the distributed optimizer the reduce-scatter left each rank only its shard of the reduced
      // gradients, and the first stage's shards do not cover the same embedding rows as the last stage's:
      // the buckets holding the embedding (E, or the loss entry with the last stage's copy) are first
      // all-gathered over dp-cp.
      if (config.shards_optimizer_state() && shape.dp * shape.cp > 1)
        for (const PipelineStage& stage : stages) {
          if (!stage.has_embedding && !stage.has_loss) continue;
          const StageParameters p = stage_parameters(model, shape, stage);
          int entry = stage.has_embedding ? static_cast<int>(p.layer_reverse.size()) - 1 : 0;
          if (!stage.has_embedding && stage.num_mtp_layers > 0) {  // the MTP layers' copy: the first m
            const auto first_m = std::find(stage.symbols.begin(), stage.symbols.end(), LayerSymbol::kMtp);
            entry = static_cast<int>(stage.symbols.end() - first_m) - 1;
          }
          int previous_end = -1;
          for (const GradBucket& b : grad_sync_buckets(shape, config, p, stage.vpp_rank, options)) {
            if (b.op.group != CommGroup::kDataContext) continue;
            if (entry > previous_end && entry <= b.ready_after_entry) {
              Op& ag = o.add(OpKind::kAllGather, "embedding_grad_ag");
              ag.role = OpRole::kEmbeddingGradReduce;
              ag.bytes = b.op.bytes;
              ag.dtype = DType::kFP32;
              ag.group = CommGroup::kDataContext;
              ag.group_size = b.op.group_size;
              ag.chunk = stage.vpp_rank;
            }
            previous_end = b.ready_after_entry;
          }
        }
      o.comm_as(OpRole::kEmbeddingGradReduce, OpKind::kAllReduce, "embedding_grad_ar",
                shape.vocab_padded / shape.tp * shape.hidden * grad_bytes, CommGroup::kEmbedding, 2,
                DType::kFP32);
      break;
    case OptimizerStep::kSequenceParallelNormGradReduce: {
      // The parameters the table marks (norms; MLA's replicated down-projections and latent norms).
      std::int64_t norm_params = 0;
      for (const PipelineStage& stage : stages)
        norm_params += sequence_parallel_grad_elements(shape, config, stage, data_context_rank, options);
      o.comm_as(OpRole::kSequenceParallelNormGrad, OpKind::kAllReduce, "sp_norm_grad_ar",
                norm_params * grad_bytes, CommGroup::kTensor, shape.tp, DType::kFP32);
      break;
    }
    case OptimizerStep::kGradNorm:
    case OptimizerStep::kAdamW: {
      // The parameters this rank updates: all of them, or under the distributed optimizer its shard of
      // every padded bucket (the executor's AdamW covers the padding too).
      std::int64_t local = 0;
      for (const PipelineStage& stage : stages) {
        const StageParameters p = stage_parameters(model, shape, stage);
        if (!config.shards_optimizer_state()) {
          local += p.dense + p.expert;
          continue;
        }
        for (const BucketFill& fill : bucket_fills(shape, config, p, options))
          local += fill.elements / (fill.expert ? shape.edp : shape.dp * shape.cp);
      }
      if (step == OptimizerStep::kAdamW) {
        o.memory(OpKind::kOptimizer, "adamw", local * 30, DType::kFP32);
        break;
      }
      o.memory(OpKind::kGradNorm, "grad_norm", local * 4, DType::kFP32);
      o.comm_as(OpRole::kGradNormReduce, OpKind::kAllReduce, "grad_norm_ar", 4, CommGroup::kWorld,
                config.world_size, DType::kFP32);
      break;
    }
  }
  return ops;
}

}  // namespace megatune::layouts
