// Step program, kernel level: every Op (GEMM, attention, memory-bound kernel, collective, p2p) a rank
// issues in one training iteration, expanded from its schedule (layouts/schedule.h).
//
// Conventions (the executor records its ops in the same form so the two lists can be compared):
// - Tokens on a rank per microbatch: T = (s / cp) * b. With sequence parallelism the norms, residual adds
//   and the p2p tensors hold T / tp rows; GEMMs always see the gathered T rows.
// - Linear layers store weights (out, in). Forward: m = T, n = out / (tp split), k = in.
//   Backward dgrad: m = T, n = in, k = out. Backward wgrad: m = out, n = in, k = T, accumulate = true
//   (fp32 main-grad accumulation). Labels: "qkv", "proj", "fc1", "fc2", "logits", "router",
//   "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2", MLA: "q_down", "q_up", "kv_down", "kv_up";
//   backward GEMMs append "_dgrad" / "_wgrad" to the label. Column-parallel out-features are split
//   by tp (qkv, fc1, q_up, kv_up, logits), row-parallel in-features (proj, fc2).
// - SwiGLU fc1 produces 2 * ffn columns. Attention: heads / tp query heads, groups / tp kv heads, causal.
//   Without context parallelism one kernel over (s, s). Context parallelism (cp_comm_type p2p, the
//   load-balanced ring of layouts/context_parallel.h): the K,V of the rank packed ("cp_kv_pack"), then cp
//   steps, each a kSend + kRecv of the next block (peers: the next / previous CP rank) followed by the
//   kernels of the held block that it overlaps (the diagonal over the micro-batch, a half block once per
//   sequence) and, after the first step, the log-sum-exp merge of its partial output ("cp_attn_merge").
//   Backward: cp steps in reverse block order, the transfer carrying K,V, K,V + dK,dV or dK,dV
//   (ring_backward_payload), the block's kernels, the dQ and dK,dV adds; then the two unpacks into the qkv
//   gradient. all_gather: one all-gather of K,V, one kernel over (s/cp, s), a reduce-scatter of dK,dV after
//   its backward.
// - Memory-bound bytes = bytes read + bytes written, bf16 activations (fp32 for the loss).
// - Communication bytes follow nccl-tests (layouts/op.h): for all-gather and reduce-scatter the full
//   (gathered) tensor. TP/SP collectives per megatron.md §4: without SP an all-reduce after proj and
//   fc2 (forward) and after the qkv and fc1 dgrads (backward); with SP an all-gather before qkv/fc1, a
//   reduce-scatter after proj/fc2, and in backward an all-gather of the output grad, an all-gather of
//   the saved input for wgrad and a reduce-scatter of the input grad. Vocab-parallel cross entropy: 3
//   all-reduces of T fp32 values over tp.
// - MoE (alltoall dispatcher): router GEMM on T / tp rows, permute, all-gather over ep of the tokens per
//   expert (fp32, the all-to-all's splits), all-to-all over ep of T/tp * topk rows, all-gather over etp,
//   expert fc1, activation, fc2 over all local rows (topk * T/tp * etp, uniform routing: the executor's
//   rows are the routed ones) as grouped GEMMs, reduce-scatter over etp, all-to-all back, unpermute, then
//   the shared expert (its fc2 accumulates into the routed output). Backward: unpermute, all-to-all, the
//   experts as the dense MLP's backward, all-to-all back, permute, the pre-MLP norm recomputed, the shared
//   expert, the router (data gradients of the shared expert's fc1 and the router accumulate into the
//   block's input gradient). allgather dispatcher (ParallelConfig::moe_token_dispatcher_type; tp-ep > 1):
//   all-gather over tp-ep of the routing (fp32 (T/tp, E)) and of the T/tp rows, permute of the rows routed
//   to the local experts, the experts, unpermute, reduce-scatter back; backward: all-gather of the output
//   gradient, the same way back, reduce-scatters of the input and probability gradients. TP > 1: the
//   shared expert gathers the block input and reduce-scatters its output (shared_expert_forward).
// - Fusion and memory (as the executor runs it): GELU runs in fc1's GEMM epilogue (no forward activation
//   kernel for GELU); bias gradients are part of the weight-gradient GEMM ops (epilogue or separate sums,
//   the backend's choice). Norm and activation outputs are not saved: fc2's dgrad is followed by one
//   activation-backward pass that also recomputes the activation output, then fc2's wgrad; each layer's
//   backward recomputes (OpPhase::kRecompute, kNorm) the pre-MLP norm before fc1's backward GEMMs and the
//   input norm before qkv's, except under full recomputation, whose layer re-run produces them.
// - --qk-layernorm (not MLA): after the qkv GEMM and before RoPE a kNorm "q_norm" and "k_norm" over the
//   rank's query and key heads (rows of head_dim); their kNormBackward after RoPE's backward. Their weights'
//   gradients join the replicated-gradient all-reduce over TP ("sp_norm_grad_ar") whenever tp > 1.
// - Loss: the LM head, cross entropy and the head's dgrad/wgrad run per token chunk (loss_chunk_rows) in the
//   forward pass (the dgrad/wgrad ops carry OpPhase::kBackward); the backward pass starts with the final
//   norm's backward.
// - Recomputation: selective re-runs the core attention forward before its backward (Megatron's default
//   "core_attn" module). Full follows the chunk's recompute plan (layouts/recompute_plan.h): each unit (a
//   uniform group, or one of block's first layers) re-runs the forward of all its layers, their TP
//   collectives included, in one span right before the backward of its last layer; kept layers re-run
//   nothing. The re-run leaves the norm outputs of the unit's last layer fresh (its backward skips their
//   recompute); every other layer recomputes them. Recomputed ops carry OpPhase::kRecompute.
// - Roles (Op::role, layouts/op.h): kCompute for every kernel; layer collectives by their group (kTensor:
//   kTensorParallel; kContext: kContextParallelRing for the ring's send/recv, else kContextParallelGather;
//   expert groups: kExpertDispatch); the p2p, gradient-reduction and optimizer collectives their own roles.
// - Streams (Op::stream): every kernel on the compute stream, every collective and p2p transfer on its
//   group's communication stream (RankGrid::stream_groups: one per communicator of the rank).
// - Pipeline: one kSend / kRecv per transfer of the schedule's p2p groups, group kPipeline, peer_rank =
//   the peer's global rank, bytes = (s/cp)(/tp with SP) * b * h * 2.
// - Gradient reduction (OpPhase::kGradSync): Megatron's buckets (max(40M, 1M * dp) elements with
//   overlap_grad_reduce, else one bucket per chunk), filled in reverse layer order; with overlap each
//   bucket's all-reduce (or reduce-scatter with the distributed optimizer) is issued right after the
//   backward op that completes it in the chunk's last microbatch, else after the whole schedule.
//   Dense grads over dp-cp, expert grads over expert-dp; fp32 (bf16 with grad_reduce_in_bf16).
//   Then: tied-embedding all-reduce between first and last stage (pp > 1, tied), all-reduce over tp of
//   the sequence-parallel norm grads (under FSDP's sharded gradients their parts in the rank's shards:
//   sequence_parallel_grad_elements), grad norm, AdamW (bytes per local param: 16 fp32 read+write of
//   param/m/v, 4 grad read, 2 bf16 param write), and with the distributed optimizer (or FSDP optim,
//   optim_grads) an all-gather of the bf16 params per bucket.
// - FSDP optim_grads and optim_grads_params (ParallelConfig::shards_gradients): buckets as with
//   overlap_grad_reduce (Megatron FSDP overlaps the reduction of sharded gradients), each reduce-scattered
//   after the backward entry that completes it in every micro-batch (fsdp_grad_reduce_ops), not after the
//   schedule: no kGradBucket op. A chunk with MTP layers keeps whole gradients (chunk_shards_gradients): its
//   kGradBucket ops stay.
// - FSDP optim_grads_params (ParallelConfig::shards_parameters): a bucket per parameter entry (reduce-
//   scattered like the distributed optimizer's, padded the same way), no gather after the step; instead each
//   forward segment is preceded by the all-gathers of the buckets of its entries (forward order), and each
//   entry's backward by its bucket's all-gather (fsdp_param_gather_op), dense over dp-cp, experts over
//   expert-dp.
#pragma once
#include <cstdint>
#include <vector>

#include "layouts/fp8.h"
#include "layouts/model_spec.h"
#include "layouts/op.h"
#include "layouts/parallel_config.h"
#include "layouts/parameter_table.h"
#include "layouts/pipeline_layout.h"
#include "layouts/rank_grid.h"
#include "layouts/rank_shape.h"
#include "layouts/recompute_plan.h"
#include "layouts/schedule.h"

namespace megatune::layouts {

enum class ContextParallelComm { kP2p, kAllGather };

// Default bytes of one chunk of logits (see loss_chunk_rows). 512 MiB: on H200, llama-1b (vocab 128256, 8192
// tokens) ran 1.4-2.5 ms faster per step than with 256 MiB (each chunk's weight gradient re-reads and
// re-writes the 1 GiB fp32 head gradient), for 0.25 GiB more peak memory (bench/RESULTS.md "executor").
constexpr std::int64_t kLossChunkLogitsBytes = std::int64_t(512) << 20;

struct StepProgramOptions {
  ContextParallelComm cp_comm = ContextParallelComm::kP2p;
  bool grad_reduce_in_bf16 = false;
  std::int64_t bucket_size_elements = 0;                         // 0: Megatron's default
  std::int64_t loss_chunk_logits_bytes = kLossChunkLogitsBytes;  // see loss_chunk_rows
  Fp8Settings fp8;  // FP8 linears and their casts (layouts/fp8.h)
};

// Where a rank's op comes from in its schedule.
struct StepProgram {
  int rank = 0;
  DenseCoordinates coordinates;
  std::vector<Op> ops;             // in issue order
  std::vector<int> schedule_item;  // per op: index into the rank's RankSchedule::items; -1 after it
};

// Tokens per chunk of the LM head + cross entropy: for the fewest equal chunks whose bf16 logits (rows x
// vocab_per_rank) stay within max_logits_bytes, their rows (rounded up to a multiple of 64 when above 64; the
// last chunk may be shorter). The head's backward GEMMs run per chunk in the forward pass, so only one chunk
// of logits is ever held.
std::int64_t loss_chunk_rows(std::int64_t tokens, std::int64_t vocab_per_rank,
                             std::int64_t max_logits_bytes = kLossChunkLogitsBytes);

// Ops of one pass of `stage` (forward, or backward with its recomputation), for one microbatch. Layer,
// microbatch and chunk fields are filled; communication ops carry group and group size, no peers.
// `segment_starts` (when given) receives, per forward segment (forward_segment_groups' order), the index of
// its first op.
std::vector<Op> stage_forward_ops(const ModelSpec& model, const RankShape& shape, const PipelineStage& stage,
                                  int microbatch, const StepProgramOptions& options = {},
                                  std::vector<std::size_t>* segment_starts = nullptr);
std::vector<Op> stage_backward_ops(const ModelSpec& model, const RankShape& shape, const PipelineStage& stage,
                                   int microbatch, const StepProgramOptions& options = {});
// The backward ops split by parameter entry, in StageParameters' reverse order (loss, layers last..first,
// embedding); stage_backward_ops is their concatenation.
std::vector<std::vector<Op>> stage_backward_ops_by_entry(const ModelSpec& model, const RankShape& shape,
                                                         const PipelineStage& stage, int microbatch,
                                                         const StepProgramOptions& options = {});
// The backward ops of parameter entries [entry_begin, entry_end) of that order, concatenated (a segment of
// the pass: see StepItem in layouts/schedule_walker.h).
std::vector<Op> stage_backward_segment_ops(const ModelSpec& model, const RankShape& shape,
                                           const PipelineStage& stage, int microbatch, int entry_begin,
                                           int entry_end, const StepProgramOptions& options = {});

// Per symbol of the stage, in order: its global decoder-layer index (t), -3 - i for MTP layer i, -1 for E,
// -2 for L (the encoding of StageParameters::layer_reverse).
std::vector<int> stage_symbol_layers(const PipelineStage& stage);

// Parameter elements a stage holds on one rank, dense (reduced over dp-cp) and expert (over expert-dp)
// (defined with the buckets and the optimizer step in grad_sync.cpp).
struct StageParameters {
  std::int64_t dense = 0;
  std::int64_t expert = 0;
  std::vector<std::int64_t>
      dense_per_layer_reverse;  // backward order: loss/output, layers last..first, embedding
  std::vector<std::int64_t> expert_per_layer_reverse;  // same order
  std::vector<int> layer_reverse;                      // the layer index of each entry (-1 E, -2 L, -3 m)
  // Elements of each entry in the flat gradient buffer: every parameter's start 64-element aligned (the
  // executor's layout, layouts/parameter_table.h); what a bucket's reduction moves. Dense entries only.
  std::vector<std::int64_t> dense_buffer_per_layer_reverse;
};
StageParameters stage_parameters(const ModelSpec& model, const RankShape& shape, const PipelineStage& stage);

// Gradient-reduction ops of one chunk (bucketed) and the index into StageParameters' reverse order after
// which each becomes ready.
struct GradBucket {
  Op op;                      // role kGradReduce or kExpertGradReduce
  int ready_after_entry = 0;  // index into StageParameters::layer_reverse
  std::int64_t elements = 0;  // parameters (= gradients) in the bucket
  bool expert = false;        // expert parameters (reduced over expert-dp), else dense (over dp-cp)
};
std::vector<GradBucket> grad_sync_buckets(const RankShape& shape, const ParallelConfig& config,
                                          const StageParameters& parameters, int chunk,
                                          const StepProgramOptions& options = {});
// The elements of the stage's largest gradient bucket (either region, padded as grad_sync_buckets pads it,
// groups of one rank included): the size of FSDP's whole-bucket gradient slots.
std::int64_t largest_grad_bucket_elements(const RankShape& shape, const ParallelConfig& config,
                                          const StageParameters& parameters,
                                          const StepProgramOptions& options = {});

// The distributed optimizer's all-gather of a bucket's updated bf16 params (role kParamGather or
// kExpertParamGather, OpPhase::kOptimizer, bytes = 2 per element).
Op param_gather_op(const GradBucket& bucket);

// FSDP optim_grads_params: the all-gather of a bucket's bf16 params right before a forward segment (phase
// kForward) or an entry's backward (kBackward) of `microbatch` reads them (role kFsdpParamGather or
// kFsdpExpertParamGather, bytes = 2 per element, the bucket's group).
Op fsdp_param_gather_op(const GradBucket& bucket, OpPhase phase, int microbatch);

// FSDP optim_grads and optim_grads_params (ParallelConfig::shards_gradients): the reduce-scatter of a
// bucket's fp32 gradients right after the backward of `microbatch` completes it (the bucket's op, phase
// kGradSync), and from the second micro-batch on the add of the reduced shard into this rank's fp32
// gradient shard ("fsdp_grad_accumulate", 3 x 4 bytes per shard element; the first writes the shard).
std::vector<Op> fsdp_grad_reduce_ops(const GradBucket& bucket, int microbatch);

// FSDP optim_grads and optim_grads_params: whether the chunk holding `stage` shards its fp32 gradients
// (fsdp_grad_reduce_ops after each bucket's backward in every micro-batch, weight gradients afresh in each
// micro-batch, no kGradBucket op). A chunk with MTP layers keeps whole gradients, as the executor's model
// does (an MTP layer's forward and backward write the head's and the embedding's gradients outside their
// entries' backward): its buckets, sized as the sharded chunks', are reduce-scattered once per step at
// their kGradBucket items, as the distributed optimizer's.
bool chunk_shards_gradients(const ParallelConfig& config, const PipelineStage& stage);

// The steps after the schedule and the grad buckets, in this order (the walker emits those that apply).
enum class OptimizerStep {
  kEmbeddingGradReduce,             // tied embedding, pp > 1, on the ranks holding E or L
  kSequenceParallelNormGradReduce,  // with sequence parallelism, or qk head norms under tp > 1
  kGradNorm,                        // local sum of squares + all-reduce over the world
  kAdamW,                           // on the local params (the shard with the distributed optimizer)
};
// Ops of one such step of a rank holding `stages` (all its chunks, by chunk); data_context_rank: the rank's
// index in its dp x cp group (RankGrid's kDpCp group), which picks its shard of sharded gradients.
std::vector<Op> optimizer_step_ops(const ModelSpec& model, const RankShape& shape,
                                   const ParallelConfig& config, const std::vector<PipelineStage>& stages,
                                   OptimizerStep step, int data_context_rank,
                                   const StepProgramOptions& options = {});
// The gradient elements of the chunk `stage` that kSequenceParallelNormGradReduce all-reduces over TP: its
// parameters marked sequence_parallel_grad, whole, or under FSDP's sharded gradients
// (chunk_shards_gradients) only their parts inside rank data_context_rank's shards of the dense buckets,
// the buffer laid out as the executor lays it (plan_grad_buffer).
std::int64_t sequence_parallel_grad_elements(const RankShape& shape, const ParallelConfig& config,
                                             const PipelineStage& stage, int data_context_rank,
                                             const StepProgramOptions& options = {});

struct RankStep;
struct StepItem;
// The ops of one item of a rank's walk (layouts/schedule_walker.h), in issue order.
std::vector<Op> step_item_ops(const ModelSpec& model, const ParallelConfig& config, const RankStep& step,
                              const StepItem& item, const StepProgramOptions& options = {});

// The whole iteration of one global rank, for a validated (model, config): step_item_ops over the items of
// walk_rank_step, concatenated.
StepProgram build_step_program(const ModelSpec& model, const ParallelConfig& config, int rank,
                               const StepProgramOptions& options = {});

}  // namespace megatune::layouts
