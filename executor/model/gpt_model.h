// GPTModel: the decoder LM (embedding, N transformer layers, final norm, LM head, cross-entropy) on one
// Backend: parameter and gradient buffers, activation buffers sized up front, forward and backward of one
// micro-batch, and the Megatron communication call sites (tensor-parallel regions) through a Communicator.
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/data/data_loader.h"
#include "executor/model/parameter_layout.h"
#include "executor/model/transformer_config.h"
#include "executor/parallel/communicator.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::executor {

using layouts::RecomputeGranularity;

// One micro-batch on the host (tokens, labels, loss mask; token-major (micro_batch * seq)).
using MicroBatch = data::MicroBatch;

struct BatchShape {
  std::int64_t micro_batch = 1;
  std::int64_t seq = 64;
  int num_microbatches = 1;  // per iteration (gradient accumulation)
  // Largest chunk of logits the LM head + loss hold at once (layouts::loss_chunk_rows; the step program's
  // StepProgramOptions::loss_chunk_logits_bytes must agree).
  std::int64_t loss_chunk_logits_bytes = layouts::kLossChunkLogitsBytes;
  std::int64_t tokens() const { return micro_batch * seq; }
};

class GPTModel {
 public:
  // Allocates every buffer from the backend arena (in sizing mode, only counts). compute_dtype is the dtype
  // of model weights and activations (bf16 in training; fp32 for gradient checks on the CPU).
  GPTModel(const TransformerConfig& config, const BatchShape& batch, RecomputeGranularity recompute,
           DType compute_dtype, Backend& backend, Communicator& communicator);

  // Megatron's initialization (normal(0, std), output layers std / sqrt(2L), norms 1, biases 0) from `seed`,
  // deterministic and independent of the backend.
  void initialize_parameters(std::uint64_t seed);
  // Host copies of the fp32 main parameters / gradients (layout().total_elements() floats, buffer order).
  std::vector<float> main_parameters() const;
  void set_main_parameters(const std::vector<float>& values);  // also refreshes the model copy
  std::vector<float> gradients() const;

  void zero_gradients();
  // Forward of micro-batch `index` of the iteration (keeps what its backward needs; the LM head's backward
  // GEMMs run here, per loss chunk, see layouts::loss_chunk_rows), then its backward.
  // Under no pipelining the backward of a micro-batch follows its forward before the next forward.
  void forward(const MicroBatch& batch, int index);
  void backward(int index);
  // Forward only (evaluation): mean loss over the counted tokens of `batch`.
  double evaluate(const MicroBatch& batch);
  // Mean loss of each micro-batch of the iteration (downloads the per-token losses once).
  std::vector<double> microbatch_losses();

  const TransformerConfig& config() const { return config_; }
  const BatchShape& batch() const { return batch_; }
  const ParameterLayout& layout() const { return layout_; }
  DType compute_dtype() const { return compute_dtype_; }
  Tensor main_params() const { return main_params_; }
  Tensor model_params() const { return model_params_; }
  Tensor grads() const { return grads_; }
  // View of one parameter inside a flat buffer (main, model or gradient). The model buffer holds no copy of
  // an untied embedding: its view is then the fp32 main parameter.
  Tensor view(Tensor buffer, const ParameterEntry& entry) const;
  // The LM head's weight: the word embedding when tied, else output_layer.weight.
  const ParameterEntry& head_entry() const;

 private:
  struct LayerWeights {
    Tensor norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  // What one layer's backward reads. "saved" tensors are per layer (one shared set under full
  // recomputation); the norm outputs and the activation output are views of buffers shared by all layers:
  // the backward recomputes them (a norm forward from the saved input and statistics unless a full-recompute
  // re-run has just written it; the activation output in the activation-backward pass).
  struct LayerActivations {
    Tensor ln1;                 // (T, h) input norm output (shared)
    Tensor ln1_mean, ln1_rstd;  // (T, 1) fp32 (saved)
    Tensor qkv;                 // (T, qkv_width) after RoPE (saved)
    Tensor attn;                // (T, heads * d) attention output (saved; shared under recomputation)
    Tensor lse;                 // (b * heads, s) fp32 (saved; shared under recomputation)
    Tensor mid;                 // (T, h) residual after attention (= input + proj) (saved)
    Tensor ln2;                 // (T, h) pre-MLP norm output (shared)
    Tensor ln2_mean, ln2_rstd;  // (T, 1) fp32 (saved)
    Tensor fc1;                 // (T, fc1_width) pre-activation (saved; the backward overwrites it with its
                                // gradient)
    Tensor act;                 // (T, ffn) activation output (shared)
  };
  // Forward of one micro-batch; with_gradients: also the LM head's backward GEMMs (per loss chunk) and the
  // bookkeeping for backward(); without (evaluation): the losses only.
  void run_forward(const MicroBatch& batch, int index, bool with_gradients);
  LayerWeights layer_weights(Tensor buffer, int layer) const;
  LayerActivations allocate_layer_activations(bool with_attention);
  void layer_forward(int layer, LayerActivations& acts, Tensor input, Tensor output, layouts::OpPhase phase);
  void layer_backward(int layer, LayerActivations& acts, Tensor input);
  LayerActivations& activations_for(int layer);
  void tensor_parallel_reduce(Tensor t);
  NormArgs norm_args(Tensor x, Tensor residual, Tensor sum_out, Tensor gamma, Tensor beta, Tensor out,
                     Tensor mean, Tensor rstd) const;
  AttentionArgs attention_args(const LayerActivations& acts) const;

  TransformerConfig config_;
  BatchShape batch_;
  RecomputeGranularity recompute_;
  DType compute_dtype_;
  Backend& backend_;
  Communicator& communicator_;
  ParameterLayout layout_;

  Tensor model_params_;  // (1, model_copy_elements_) compute dtype; aliases main_params_ when fp32
  std::int64_t model_copy_elements_ = 0;  // leading elements copied (untied embedding tables, last: not)
  Tensor main_params_;                    // (1, total) fp32
  Tensor grads_;                          // (1, total) fp32
  // Gradient bookkeeping of an iteration: the GEMM weights' gradients (linear layers, LM head) are not
  // zeroed; their first weight-gradient GEMM of the iteration overwrites them (beta = 0: no read of the
  // fp32 gradient, and the GEMM's algorithm is tuned), later ones accumulate. zeroed_grads_ are the rest of
  // the buffer (norms, biases, embedding tables, padding), zeroed by zero_gradients().
  std::vector<Tensor> zeroed_grads_;
  std::vector<bool> layer_grads_written_;  // per layer: its GEMM weight gradients hold this iteration's sum
  bool head_grad_written_ = false;         // the LM head's weight gradient likewise

  std::vector<Tensor> residual_;                 // L + 1 of (T, h): layer inputs and the last output
  std::vector<LayerActivations> saved_;          // per layer (none/selective) or one shared (full)
  Tensor shared_attn_, shared_lse_;              // selective recompute: recomputed attention output
  Tensor norm1_out_, norm2_out_;                 // (T, h) shared norm outputs
  Tensor mlp_scratch_;                           // (1, T * max(ffn, attn + qkv widths)): see the constructor
  Tensor fc2_out_;                               // (T, h) forward GEMM output (aliases d_hidden_)
  Tensor final_norm_, final_mean_, final_rstd_;  // (T, h), (T, 1), (T, 1)
  Tensor logits_;                                // (chunk, V) one token chunk, overwritten by its gradient
  std::int64_t loss_chunk_rows_ = 0;             // tokens per LM-head / loss chunk
  Tensor tokens_, targets_;                      // (T, 1) int32
  Tensor losses_;                                // (num_microbatches, T) fp32
  // Backward scratch (views into mlp_scratch_ where their lifetimes allow; see the constructor).
  Tensor d_res_, d_mid_, d_hidden_, d_attn_, d_qkv_;
  std::vector<double> counted_tokens_;  // per micro-batch of the iteration
  int pending_backward_ = -1;           // micro-batch whose forward ran and backward has not
};

}  // namespace megatune::executor
