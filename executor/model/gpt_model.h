// GPTModel: one pipeline stage (model chunk) of the decoder LM (embedding, transformer layers, final norm, LM
// head, cross-entropy) on one Backend and one tensor-parallel rank: parameter and gradient buffers,
// activation slots sized up front (one per micro-batch in flight), forward and backward of one micro-batch,
// and Megatron's tensor- and sequence-parallel communication (its linears:
// executor/parallel/tensor_parallel.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/data/data_loader.h"
#include "executor/model/mla_attention.h"
#include "executor/model/moe_layer.h"
#include "executor/model/mtp_block.h"
#include "executor/model/parameter_layout.h"
#include "executor/model/ring_attention.h"
#include "executor/model/transformer_config.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/grad_buckets.h"
#include "executor/parallel/parameter_residence.h"
#include "executor/parallel/tensor_parallel.h"
#include "layouts/parallel_config.h"
#include "layouts/recompute_plan.h"
#include "layouts/step_program.h"

namespace megatune::executor {

using layouts::RecomputeGranularity;

// One micro-batch on the host (tokens, labels, loss mask; token-major (micro_batch * seq)).
using MicroBatch = data::MicroBatch;

struct BatchShape {
  std::int64_t micro_batch = 1;
  std::int64_t seq = 64;     // the whole sequence; GPTModel::batch() holds a CP rank's local share
  int num_microbatches = 1;  // per iteration (gradient accumulation)
  // Largest chunk of logits the LM head + loss hold at once (layouts::loss_chunk_rows; the step program's
  // StepProgramOptions::loss_chunk_logits_bytes must agree).
  std::int64_t loss_chunk_logits_bytes = layouts::kLossChunkLogitsBytes;
  // Micro-batches whose forward ran and whose backward (and the send of its input gradient) has not: one
  // activation slot each (layouts::max_in_flight_microbatches per chunk; 1 without pipelining).
  int activation_slots = 1;
  // The loss gradient is scaled by 1 / (counted tokens * num_microbatches * gradient_average_ranks): the
  // data-parallel ranks' summed gradients are then their mean.
  int gradient_average_ranks = 1;
  // The distributed optimizer holds the fp32 main parameters, each rank its shard: the model keeps none
  // (an fp32 model's parameters are its main parameters), and its compute-dtype copy covers every parameter,
  // the untied embedding tables included (the updated parameters are all-gathered into it bucket by bucket).
  bool main_parameters_sharded = false;
  // Megatron FSDP optim_grads_params: the model keeps no compute-dtype copy; its parameters are read where
  // the strategy placed their gathered buckets (ParameterResidence). Not taken by an fp32 model (its
  // parameters are its main parameters), nor by a chunk holding MTP layers (their segments read the
  // embedding's and the head's parameters): parameters_gathered_at_use().
  bool parameters_gathered_at_use = false;
  // Megatron FSDP optim_grads / optim_grads_params: the model keeps no fp32 gradient buffer; its gradients
  // are written where the strategy placed their bucket's slot (GradientResidence). Needs the sharded main
  // parameters; not taken by a chunk holding MTP layers (their backward writes the embedding's and the
  // head's gradients): gradients_sharded().
  bool gradients_sharded = false;
  // How the parameter and gradient buffers split into gradient buckets (their offsets and padding).
  BufferBucketing bucketing;
};

class GPTModel final : public ParameterResidence, public GradientResidence {
 public:
  // Allocates every buffer from the backend arena (in sizing mode, only counts). compute_dtype is the dtype
  // of model weights and activations (bf16 in training; fp32 for gradient checks on the CPU).
  // `stage`: the layers (global numbering), embedding, MTP layers and loss this chunk holds (default: the
  // whole model, its MTP layers included). The tensor-parallel rank and size come from the communicator
  // (CommGroup::kTensor), which must agree with config.tensor_parallel_size. `recompute`: the recomputation
  // flags; under full recomputation the chunk's plan (layouts/recompute_plan.h) decides which layers are
  // re-run, unit by unit, before the backward of each unit's last layer (a granularity alone: uniform 1).
  GPTModel(const TransformerConfig& config, const BatchShape& batch,
           const layouts::RecomputeSettings& recompute, DType compute_dtype, Backend& backend,
           Communicator& communicator, const StageSpan& stage = {});

  // Megatron's initialization (normal(0, std), output layers std / sqrt(2L), norms 1, biases 0) from `seed`,
  // deterministic and independent of the backend and of the layout: each parameter is drawn whole (seeded by
  // its name) and this rank keeps its tensor-parallel slice, so every layout starts from the same weights.
  // initial_parameters: those values (buffer order, padding zero); initialize_parameters sets them.
  std::vector<float> initial_parameters(std::uint64_t seed) const;
  void initialize_parameters(std::uint64_t seed) { set_main_parameters(initial_parameters(seed)); }
  // Host copies of the fp32 main parameters / gradients (layout().total_elements() floats, buffer order).
  // main_parameters: std::logic_error when the model keeps none (BatchShape::main_parameters_sharded: the
  // DataParallelStrategy has them).
  std::vector<float> main_parameters() const;
  // Sets the main parameters the model keeps and its compute-dtype copy (without main parameters: the copy).
  void set_main_parameters(const std::vector<float>& values);
  std::vector<float> gradients() const;

  void zero_gradients();
  // The FP8 linears cast their weights again at their next forward (zero_gradients does it too: the step
  // changed them).
  void fp8_weights_changed();
  // Forward of micro-batch `index` of the iteration (keeps what its backward needs in the micro-batch's
  // activation slot; the LM head's backward GEMMs run here, per loss chunk, see layouts::loss_chunk_rows),
  // later its backward. On a stage without the embedding the input must have been received into
  // stage_input(index) first; on a stage without the loss the output gradient into output_grad(index) before
  // the backward. `batch` supplies tokens (embedding stage) and labels / loss mask (loss stage).
  void forward(const MicroBatch& batch, int index);
  // Segments [begin, end) of that forward, in layouts::forward_segment_groups' order (the embedding, each
  // decoder layer, the head: final norm, MTP layers, LM head and loss), so that the caller can wait the
  // parameters a segment reads right before it (DataParallelStrategy::before_forward with the segment's
  // group); the pass is complete after the segment that reaches the last one.
  void forward(const MicroBatch& batch, int index, int begin, int end);
  int forward_segments() const;
  std::vector<int> forward_segment_groups() const;  // of each segment: GradBufferEntry::group's code
  void backward(int index);
  // One segment of the backward: entries [begin, end) of backward_entries() in Megatron's buffer order (the
  // loss, the layers last..first, the embedding), so that a gradient bucket's reduction can start between
  // them; the pass is complete after the segment that reaches the last entry.
  void backward(int index, int begin, int end);
  int backward_entries() const;
  // Pipeline I/O of micro-batch `index`, (rows, hidden) with rows = tokens (/ tp under sequence parallelism);
  // the first use acquires the micro-batch's slot. stage_input: the first layer's input; stage_output: the
  // last layer's output; output_grad: the gradient of stage_output; input_grad: the gradient of stage_input
  // (written by backward()).
  Tensor stage_input(int index);
  Tensor stage_output(int index);
  Tensor output_grad(int index);
  Tensor input_grad(int index);
  // The micro-batch's slot is free again (after its backward, once its input gradient was sent; on the
  // embedding stage the backward frees it).
  void release(int index);
  // The micro-batches of the coming iterations (Megatron's batch-size ramp-up changes them between
  // iterations): at least 1 and at most the BatchShape::num_microbatches the model was built for (its loss
  // buffers); every slot must be free. The loss gradient's 1 / num_microbatches follows.
  void set_num_microbatches(int count);
  int microbatch_capacity() const { return microbatch_capacity_; }
  const StageSpan& stage() const { return stage_; }
  // Which of the chunk's layers full recomputation re-runs, and in which units.
  const layouts::RecomputePlan& recompute_plan() const { return plan_; }
  int local_layers() const { return stage_.num_layers; }
  // Forward only (evaluation): mean loss over the counted tokens of `batch`.
  double evaluate(const MicroBatch& batch);
  // Forward only of micro-batch `index` inside a pipeline (evaluation): no gradient work. The loss stage
  // frees the slot at once; other stages keep it (stage_output(index)) until release(index), after the send.
  void forward_only(const MicroBatch& batch, int index);
  void forward_only(const MicroBatch& batch, int index, int begin, int end);  // segments, as forward's
  // Tokens of micro-batch `index` counted in its loss (loss stage; set by its forward).
  double counted_tokens(int index) const { return counted_tokens_.at(index); }
  // Mean loss of each micro-batch of the iteration (downloads the per-token losses once).
  std::vector<double> microbatch_losses();
  // Multi-token prediction: per MTP layer of this stage, the mean over the iteration's micro-batches of its
  // mean token loss (Megatron's logged "mtp_k loss" before the mean over data-parallel ranks); empty
  // without MTP layers.
  std::vector<double> mtp_losses();
  // Tokens each micro-batch of the iteration counted in its loss (the loss stage, after the forwards).
  const std::vector<double>& counted_tokens() const { return counted_tokens_; }

  const TransformerConfig& config() const { return config_; }
  const BatchShape& batch() const { return batch_; }
  const layouts::RankShape& shape() const { return shape_; }
  const ParameterLayout& layout() const { return layout_; }
  DType compute_dtype() const { return compute_dtype_; }
  Tensor main_params() const { return main_params_; }  // empty when the model keeps none
  // (1, total) compute dtype; without storage under parameters_gathered_at_use().
  Tensor model_params() const { return model_params_; }
  // Whether the parameters are read only where a strategy placed them (BatchShape's rule).
  bool parameters_gathered_at_use() const { return gathered_at_use_; }
  // The LM head is the word embedding of this same chunk (tied): the head's segment reads the embedding's.
  bool head_reads_embedding() const {
    return config_.tied_embeddings && stage_.has_embedding && stage_.has_loss;
  }
  void place_parameters(int layer_code, std::int64_t begin, std::int64_t end, Tensor storage) override;
  void release_parameters(int layer_code, std::int64_t begin) override;
  // Whether the gradients are written only where a strategy placed them (BatchShape's rule); grads() then
  // has no storage.
  bool gradients_sharded() const { return grads_sharded_; }
  void place_gradients(std::int64_t begin, std::int64_t end, Tensor storage) override;
  void release_gradients(std::int64_t begin) override;
  Tensor grads() const { return grads_; }
  // View of one parameter inside a flat buffer (main, model or gradient). The model buffer holds no copy of
  // an untied embedding: its view is then the fp32 main parameter.
  Tensor view(Tensor buffer, const ParameterEntry& entry) const;
  // The LM head's weight: the word embedding when tied, else output_layer.weight (loss stage only).
  const ParameterEntry& head_entry() const;
  // MoE: the sum over this stage's MoE layers and the iteration's forwards (since zero_gradients()) of the
  // load-balancing loss / its coefficient, each micro-batch weighted 1 / micro-batches (Megatron's logged
  // value before its mean over the MoE layers); 0 for a dense model.
  double moe_load_balancing_loss() const { return moe_ ? moe_->logged_load_balancing_loss() : 0.0; }
  const MoeLayers* moe_layers() const { return moe_.get(); }
  MoeLayers* moe_layers() { return moe_.get(); }
  // The global layer number of each of the stage's MoE layers (MoeLayers' local order).
  std::vector<int> moe_layer_numbers() const;
  // Norm parameters whose gradients are all-reduced over TP after the schedule (sequence parallelism).
  std::vector<const ParameterEntry*> sequence_parallel_grad_entries() const;

 private:
  // A layer's norm weights (or their gradients); the linears hold their own (LayerLinears).
  struct LayerWeights {
    Tensor norm1_w, norm1_b, norm2_w, norm2_b;
    MlaAttention::LatentNorms mla;  // multi-latent attention's latent norms
    // --qk-layernorm's head norms (1, head_dim): q weight / bias, k weight / bias (biases under LayerNorm).
    Tensor q_norm_w, q_norm_b, k_norm_w, k_norm_b;
  };
  // A layer's parameters in the layout (null where the model has none: LayerNorm biases under RMSNorm,
  // linear biases without --add-bias-linear). Shapes on this TP rank: norms (1, h); qkv (qkv_width, h);
  // proj (h, heads_per_rank * d); fc1 (fc1_width, h); fc2 (h, ffn_per_rank); biases (1, out).
  struct LayerParameters {
    const ParameterEntry *norm1_w = nullptr, *norm1_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr,
                         *proj_w = nullptr, *proj_b = nullptr, *norm2_w = nullptr, *norm2_b = nullptr,
                         *fc1_w = nullptr, *fc1_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;
    // --qk-layernorm's k head norm (its q head norm is q_norm_w / q_norm_b below, MLA's q latent norm's
    // name).
    const ParameterEntry *k_norm_w = nullptr, *k_norm_b = nullptr;
    // Multi-latent attention (MlaAttention::Weights' shapes).
    const ParameterEntry *q_down = nullptr, *q_norm_w = nullptr, *q_norm_b = nullptr, *q_up = nullptr,
                         *kv_down = nullptr, *kv_norm_w = nullptr, *kv_norm_b = nullptr, *kv_up = nullptr;
    // MoE layers: the router, this rank's experts, the shared expert; moe_local: index among the stage's
    // MoE layers (-1: a dense layer).
    const ParameterEntry *router = nullptr, *shared_fc1 = nullptr, *shared_fc2 = nullptr;
    std::vector<const ParameterEntry*> expert_fc1, expert_fc2;
    int moe_local = -1;
  };
  // A layer's linears (gpt_model_linears.cpp), built from its LayerParameters once the buffers exist: each
  // one's TP split comes from the parameter table. Empty where the layer has none.
  struct LayerLinears {
    std::optional<TensorParallelLinear> qkv, proj, fc1, fc2;           // dense attention and MLP
    std::optional<TensorParallelLinear> q_down, q_up, kv_down, kv_up;  // multi-latent attention
    std::optional<TensorParallelLinear> router, shared_fc1, shared_fc2;
    std::optional<ExpertLinears> expert_fc1, expert_fc2;  // this rank's routed experts
  };
  void build_linears();
  // FP8 (config_.fp8 enabled): the dense attention's and MLP's linears of every layer run their GEMMs in FP8
  // (layouts/fp8.h); their states and the shared cast buffers (gpt_model_fp8.cpp).
  void setup_fp8();
  LinearParameters linear_parameters(const ParameterEntry& weight, const ParameterEntry* bias) const;
  LayerLinears layer_linears(const LayerParameters& p, int layer) const;
  MoeLayerLinears moe_linears(int layer) const;
  MlaAttention::Weights mla_weights(int layer) const;
  void index_layer_parameters();
  // What one layer's backward reads. "saved" tensors are per layer and slot for a kept layer; a recomputed
  // layer uses the set of its position in its unit, shared by every unit and slot (its unit re-runs right
  // before the backward needs it); the norm outputs and the activation output are views of buffers shared
  // by all layers: the backward recomputes them (a norm forward from the saved input and statistics unless
  // the re-run of its unit has just written it: the unit's last layer; the activation output in the
  // activation-backward pass).
  struct LayerActivations {
    Tensor ln1;                 // (T, h) input norm output (shared)
    Tensor ln1_mean, ln1_rstd;  // (T, 1) fp32 (saved)
    Tensor qkv;                 // (T, qkv_width) after RoPE (saved)
    Tensor attn;                // (T, heads * d) attention output (saved; shared under recomputation)
    Tensor lse;                 // (b * heads, s) fp32 (saved; shared under recomputation)
    Tensor cp_kv;               // (T, 2 kv width) the ring's last K,V block (context parallelism; as lse)
    Tensor mid;                 // (T, h) residual after attention (= input + proj) (saved)
    Tensor ln2;                 // (T, h) pre-MLP norm output (shared)
    Tensor ln2_mean, ln2_rstd;  // (T, 1) fp32 (saved)
    Tensor fc1;                 // (T, fc1_width) pre-activation (saved; the backward overwrites it with its
                                // gradient)
    Tensor act;                 // (T, ffn) activation output (shared)
    MlaAttention::Saved mla;    // multi-latent attention's latents, q, k, v (saved; instead of qkv)
    // --qk-layernorm (saved): the head norms' inputs, (T * heads / tp, d) and (T * groups / tp, d) (token-
    // major: row t * heads + i is head i of token t), and their statistics (mean: LayerNorm only).
    Tensor q_pre, k_pre;
    Tensor q_mean, q_rstd, k_mean, k_rstd;  // (rows of q_pre / k_pre, 1) fp32
  };
  // Forward of one micro-batch; with_gradients: also the LM head's backward GEMMs (per loss chunk) and the
  // bookkeeping for backward(); without (evaluation): the losses only.
  void run_forward(const MicroBatch& batch, int index, int begin, int end, bool with_gradients);
  void embedding_forward(const MicroBatch& batch, int slot);
  void loss_forward(const MicroBatch& batch, int index, int slot, bool with_gradients);
  void loss_backward(int slot);
  void embedding_backward(int slot);
  LayerWeights layer_weights(Tensor buffer, int layer) const;
  // dense_mlp: the layer's MLP is dense (it keeps the fc1 output; an MoE layer's rows are MoeLayers').
  LayerActivations allocate_layer_activations(bool with_attention, bool dense_mlp);
  void layer_forward(int layer, LayerActivations& acts, Tensor input, Tensor output, layouts::OpPhase phase);
  // norms_fresh: the unit's re-run has just written this layer's norm outputs (the unit's last layer).
  void layer_backward(int layer, LayerActivations& acts, Tensor input, bool norms_fresh);
  // The re-run (OpPhase::kRecompute) of the unit ending at decoder layer `layer` of `slot`, if one does.
  void recompute_unit_ending_at(int layer, int slot);
  // --qk-layernorm (gpt_model_qk_norm.cpp): the head norms over the Q and K columns of acts.qkv, in place
  // before RoPE; their backward over the Q and K columns of d_qkv_ after RoPE's (weight gradients
  // accumulate).
  void qk_norm_forward(int layer, LayerActivations& acts, layouts::OpPhase phase);
  void qk_norm_backward(int layer, LayerActivations& acts);
  void allocate_qk_norm_saved(LayerActivations& acts);
  // Multi-latent attention's backward from the attention output's gradient (d_attn_) to the input norm
  // output's gradient (d_hidden_shard_).
  void mla_backward(int layer, LayerActivations& acts, Tensor input, bool accumulate, bool norms_fresh);
  // An MoE layer's MLP backward on the sequence shard: d_in = the gradient of the pre-MLP norm output's
  // shard from d_out (the layer output's gradient shard).
  void moe_mlp_backward(int layer, LayerActivations& acts, Tensor d_out, Tensor d_in, bool accumulate,
                        bool norms_fresh);
  LayerActivations& activations_for(int slot, int local_layer);
  // Multi-token prediction (gpt_model_mtp.cpp). Layers are numbered globally: decoder layers 0.., MTP layer
  // k as -3 - k; local_index() is their place in layer_parameters_ (decoder layers, then MTP layers).
  int local_index(int layer) const;
  int global_layer(int local) const;  // local_index's inverse
  // The loss stage holds every MTP layer (run_setup refuses other placements).
  static StageSpan with_mtp_layers(const TransformerConfig& config, StageSpan stage);
  int local_layer_count() const { return stage_.num_layers + stage_.num_mtp_layers; }
  bool layer_is_moe(int layer) const { return config_.is_moe_layer(layer); }
  bool holds_last_layer() const;
  bool holds_final_norm() const;  // with MTP: the stage of the last decoder layer (Megatron's placement)
  // Its last layer's output goes only to the next stage (no loss, final norm or MTP layer reads it here).
  bool sends_its_output() const;
  std::pair<Tensor, Tensor> norm_weights(Tensor buffer, const std::string& prefix) const;
  void allocate_mtp();
  void final_norm_forward(int slot, layouts::OpPhase phase);
  void final_norm_backward(int slot, Tensor d_out);
  void mtp_forward(const MicroBatch& batch, int index, int slot, bool with_gradients);
  void mtp_backward(int slot, int mtp_local);
  void eh_proj_forward(int mtp_layer, MtpLayerSaved& saved);     // mtp_layer: the model's MTP layer k
  Tensor eh_proj_backward(int mtp_local, MtpLayerSaved& saved);  // mtp_local: the stage's MTP layer index
  void mtp_embedding_backward(int mtp_layer, const MtpLayerSaved& saved, Tensor d_embedding);
  // The vocab-parallel embedding of `global_ids` (T) into output (rows, h): tokens receives this rank's ids.
  void embed_tokens(const std::vector<std::int32_t>& global_ids, Tensor tokens, Tensor output,
                    const SequencePositions& positions, int layer);
  // The LM head `head` (head_ or an MTP layer's) and the loss per token chunk (layouts::loss_chunk_rows) on
  // the normed hidden states (rows, h): logits, cross entropy into `losses` (1, T), and with gradients the
  // head's data gradient into head_grad (T, h) and its weight gradient.
  void head_and_loss(const TensorParallelLinear& head, Tensor hidden, Tensor targets, Tensor losses,
                     float grad_scale, Tensor head_grad, bool with_gradients, int layer);
  int slot_of(int index);  // acquires a slot on first use
  bool sp() const { return tp_.sequence_parallel(); }
  bool keeps_main_parameters() const {
    return compute_dtype_ == DType::kFP32 || !batch_.main_parameters_sharded;
  }
  NormArgs norm_args(Tensor x, Tensor residual, Tensor sum_out, Tensor gamma, Tensor beta, Tensor out,
                     Tensor mean, Tensor rstd) const;
  AttentionArgs attention_args(const LayerActivations& acts) const;
  // Core attention (attn, lse from qkv; d_qkv_ from d_attn_): one kernel, or the context-parallel ring.
  void core_attention_forward(LayerActivations& acts, int layer, layouts::OpPhase phase);
  void core_attention_backward(LayerActivations& acts, int layer);
  RingAttentionShape ring_shape() const;
  // UserError when the backend's attention kernels cannot run this model's attention shape.
  void require_attention_support() const;

  TransformerConfig config_;
  BatchShape batch_;
  layouts::RankShape shape_;  // this rank's shapes: per-TP-rank sizes, the local micro-batch's tokens
  layouts::RecomputeSettings recompute_;
  layouts::RecomputePlan plan_;  // this chunk's (decoder layers, then MTP layers)
  DType compute_dtype_;
  Backend& backend_;
  Communicator& communicator_;
  TensorParallelRegions tp_;  // the TP group's mappings (the vocab-parallel embedding's, the linears')
  StageSpan stage_;
  ParameterLayout layout_;
  std::vector<LayerParameters> layer_parameters_;  // per local layer
  std::vector<LayerLinears> layer_linears_;        // per local layer
  std::optional<TensorParallelLinear> head_;       // the LM head (loss stage)
  std::vector<TensorParallelLinear> mtp_heads_;    // per MTP layer of the stage: the shared LM head's use
  std::vector<TensorParallelLinear> eh_proj_;      // per MTP layer of the stage
  std::unique_ptr<MlaAttention> mla_;              // multi-latent attention (shared by the layers)
  int tp_rank_ = 0, tp_size_ = 1;
  int cp_rank_ = 0, cp_size_ = 1;
  SequencePositions positions_;          // global positions of the local sequence (context parallelism)
  std::unique_ptr<RingAttention> ring_;  // context parallelism's attention (cp > 1)
  std::int64_t rows_ = 0;                // rows of the residual stream on this rank: T, or T / tp under SP

  Tensor model_params_;  // (1, model_copy_elements_) compute dtype; aliases main_params_ when fp32
  std::int64_t model_copy_elements_ = 0;  // leading elements copied (untied embedding tables, last: not)
  Tensor main_params_;  // (1, total) fp32; empty under main_parameters_sharded with a bf16 copy
  bool gathered_at_use_ = false;
  struct PlacedRange {
    std::int64_t begin = 0, end = 0;  // of the chunk's buffer
    Tensor storage;                   // (1, end - begin) compute dtype
  };
  std::vector<PlacedRange> placed_;  // under gathered_at_use_: the ranges readable now
  bool grads_sharded_ = false;
  std::vector<PlacedRange> placed_grads_;  // under grads_sharded_: the fp32 ranges written now
  // The entries whose placement changed since their linears took their weight views (layer codes).
  std::vector<int> unbound_codes_;
  // Whether a view of a parameter not placed is an error (else a view without storage: what the linears
  // hold while their entry is not gathered).
  bool placed_views_required_ = false;
  Tensor placed_view(const ParameterEntry& entry) const;
  Tensor placed_grad_view(const ParameterEntry& entry) const;
  // The layer codes of the entries in [begin, end) to bind again (the LM head's, -2, when its weight is in).
  void unbind_range(std::int64_t begin, std::int64_t end, bool fresh_gradients);
  // Points the linears of the entries placed or released since the last pass at their placement.
  void bind_placed_linears();
  Tensor grads_;  // (1, total) fp32
  // Gradient bookkeeping of an iteration: the GEMM weights' gradients (linear layers, LM head) are not
  // zeroed; their first weight-gradient GEMM of the iteration overwrites them (beta = 0: no read of the
  // fp32 gradient, and the GEMM's algorithm is tuned), later ones accumulate. zeroed_grads_ are the rest of
  // the buffer (norms, biases, embedding tables, padding), zeroed by zero_gradients().
  std::vector<Tensor> zeroed_grads_;
  std::vector<bool> layer_grads_written_;  // per layer: its GEMM weight gradients hold this iteration's sum
  bool head_grad_written_ = false;         // the LM head's weight gradient likewise

  // What one activation slot holds (one micro-batch in flight).
  struct Slot {
    // local layers + 1 of (rows, h): layer inputs and the last output; with MTP the stage of the last layer
    // appends the final norm's output (the stage output, MTP's first hidden input). The input of a layer
    // inside a recompute unit (not its first) is not saved: a view of unit_residuals_.
    std::vector<Tensor> residual;
    std::vector<LayerActivations> saved;  // per local layer, MTP layers last; empty for a recomputed layer
    Tensor tokens;                        // (T, 1) int32 local token ids (embedding stage)
    Tensor final_norm, final_mean, final_rstd;  // (rows, h), (rows, 1), (rows, 1) (loss stage)
    Tensor head_grad;                // (T, h) gradient of the final norm output from the LM head (loss stage)
    Tensor output_grad, input_grad;  // (rows, h) pipeline gradients (stages without the loss / embedding)
  };
  std::vector<Slot> slots_;
  std::vector<int> slot_of_microbatch_;      // -1: none
  std::vector<bool> forward_done_;           // per micro-batch: forward ran, backward not yet
  std::vector<LayerActivations> unit_sets_;  // full recompute: per position in a unit, shared
  std::vector<Tensor> unit_residuals_;       // (rows, h) inputs of a unit's layers after its first, shared
  Tensor stage_output_;  // (rows, h) the last layer's output of a stage that sends it: one for every slot
  Tensor shared_attn_, shared_lse_;   // selective recompute: recomputed attention output
  Tensor norm1_out_, norm2_out_;      // (T, h) shared norm outputs (gathered under SP)
  Tensor norm1_shard_, norm2_shard_;  // (T / tp, h) norm outputs on the shard (SP only)
  Tensor mlp_scratch_;                // (1, T * max(ffn, attn + qkv widths)): see the constructor
  Tensor fc2_out_;                    // (T, h) forward GEMM output (aliases d_hidden_)
  Tensor reduced_;       // (rows, h) the reduced row-parallel output (aliases fc2_out_ without SP)
  Tensor full_scratch_;  // (T, h) gathered activations / gradients under SP (embedding output too)
  Tensor final_full_;    // (T, h) the gathered final norm output (aliases the slot's without SP)
  Tensor logits_;        // (chunk, V / tp) one token chunk, overwritten by its gradient
  Backend::CrossEntropyStats ce_stats_;  // (chunk, 1) fp32 each, vocab-parallel cross entropy (tp > 1)
  std::int64_t loss_chunk_rows_ = 0;     // tokens per LM-head / loss chunk
  Tensor targets_;                       // (T, 1) int32
  Tensor losses_;                        // (num_microbatches, T) fp32
  // Backward scratch (views into mlp_scratch_ where their lifetimes allow; see the constructor).
  Tensor d_res_, d_mid_, d_hidden_, d_attn_, d_qkv_;
  // --qk-layernorm: (T * heads / tp, d) each, the head norms' contiguous output and gradient (shared).
  Tensor qk_norm_out_, qk_norm_grad_;
  Tensor d_hidden_shard_;               // (rows, h) the reduced input gradient (aliases d_hidden_ without SP)
  std::vector<double> counted_tokens_;  // per micro-batch of the iteration
  int microbatch_capacity_ = 1;         // the micro-batches losses_ (and the MTP losses) hold
  std::unique_ptr<MoeLayers> moe_;      // the stage's MoE layers (null for a dense stage)
  std::unique_ptr<MtpBuffers> mtp_;     // the stage's MTP layers (null without)
  int moe_slot_ = 0;                    // the activation slot of the micro-batch being run
  std::vector<Fp8LinearState> fp8_states_;       // per FP8 linear (sized once: the linears point into it)
  std::unique_ptr<Fp8Workspace> fp8_workspace_;  // null without FP8
};

}  // namespace megatune::executor
