// Tensor-parallel linear layers in one place, as Megatron-Core's tensor_parallel/layers.py and mappings.py:
// TensorParallelRegions (the mappings between the sequence-parallel, tensor-parallel and replicated regions
// over the TP group), TensorParallelLinear (one linear layer: its forward, data- and weight-gradient GEMMs,
// its SP all-gather / reduce-scatter or all-reduce and its op labels; column-parallel, row-parallel or
// replicated as layouts' parameter table splits its weight) and ExpertLinears (the local experts' fc1s or
// fc2s as grouped GEMMs). Every GEMM of a linear layer and every TP collective of one is issued here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"
#include "layouts/op.h"
#include "layouts/parameter_table.h"

namespace megatune::executor {

// The three GEMMs of a linear layer with weight (out, in) over m tokens (layouts/step_program.h's shapes):
// y = x . W^T (+ bias); dx = dy . W; dW (+)= dy^T . x into the fp32 grad buffer (+ the bias gradient).
GemmArgs linear_forward_args(Tensor x, Tensor weight, Tensor y, Tensor bias, std::int64_t m);
GemmArgs linear_data_grad_args(Tensor dy, Tensor weight, Tensor dx, std::int64_t m);
GemmArgs linear_weight_grad_args(Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias,
                                 std::int64_t tokens);

// Megatron's mappings over this rank's tensor-parallel group (CommGroup::kTensor). Nothing is issued at TP
// size 1, and sequence parallelism only applies at TP > 1. Collectives carry OpRole::kTensorParallel.
class TensorParallelRegions {
 public:
  // backend: the model's (its kernels run the copies of gather_features).
  TensorParallelRegions(Backend& backend, Communicator& communicator, bool sequence_parallel);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  Backend& backend() const { return *backend_; }

  // gather_from_sequence_parallel_region: under SP every rank's (T / tp, c) shard into `full` (T, c), which
  // is returned; otherwise the shard itself.
  Tensor gather_sequence(Tensor shard, Tensor full, const char* label, int layer,
                         layouts::OpPhase phase) const;
  // The sum over TP of `partial` (T, c): under SP reduce_scatter_to_sequence_parallel_region into `shard`
  // (T / tp, c), else reduce_from_tensor_model_parallel_region (an all-reduce in place); returns the tensor
  // that holds the sum (partial itself at TP 1).
  Tensor reduce(Tensor partial, Tensor shard, const char* all_reduce_label, const char* reduce_scatter_label,
                int layer, layouts::OpPhase phase) const;
  // gather_from_tensor_model_parallel_region along the last dimension, then under SP
  // scatter_to_sequence_parallel_region: every rank's `part` (T, c) all-gathered into `gathered`
  // (tp * T, c), and `out` (rows, tp * c) receives the rows [first, first + rows) of the (T, tp * c) result
  // (first: this rank's sequence shard under SP, else 0). At TP 1 part is copied into out.
  void gather_features(Tensor part, Tensor gathered, Tensor out, const char* label, int layer,
                       layouts::OpPhase phase) const;

 private:
  Backend* backend_;
  Communicator* communicator_;
  int rank_ = 0, size_ = 1;
  bool sequence_parallel_ = false;
};

// How TP splits a linear layer's weight (out, in), read from layouts' parameter table (ParameterSpec::split,
// the one home of the TP plan): its rows split is column-parallel (the out features), its columns split
// row-parallel (the in features); a replicated weight is a replicated linear (routers, MLA down-projections).
enum class LinearParallelism { kColumn, kRow, kReplicated };
LinearParallelism linear_parallelism(const layouts::ParameterSpec& weight);

// A linear layer's weight (out, in) and optional bias (1, out) in the compute dtype, and their fp32
// gradients: views into the model's buffers (null bias: none).
struct LinearParameters {
  Tensor weight, bias, d_weight, d_bias;
};

// A linear layer's op labels. gemm: the forward GEMM's; the backward GEMMs append "_dgrad" / "_wgrad". The
// collectives' labels, empty for the defaults: input_gather gemm + "_input_ag" (column-parallel under SP:
// the input's all-gather, before the forward and again before the weight gradient); reduce_all_reduce /
// reduce_scatter the sum over TP (column-parallel: the input gradient's, gemm + "_dgrad_ar" / "_dgrad_rs";
// row-parallel: the output's, gemm + "_ar" / "_rs"); grad_gather gemm + "_grad_ag" (under SP: the output
// gradient's all-gather); output_gather gemm + "_output_ag" (a gathered column-parallel output).
struct LinearLabels {
  std::string gemm;
  std::string input_gather = {};
  std::string reduce_all_reduce = {};
  std::string reduce_scatter = {};
  std::string grad_gather = {};
  std::string output_gather = {};
};

// FP8 linears (layouts/fp8.h). Fp8Workspace: one per model, the cast outputs that live from a cast to the
// GEMMs that read it (flat FP8 buffers, each as large as the largest use; grad_source: the output gradient
// whose cast grad / grad_t hold, and the linear it belongs to). Fp8LinearState: per FP8 linear, its weight's
// FP8 copy and transpose (cast once per iteration: weight_cast) and the scaling states of its input,
// weight, output gradient and transposed input (fp32 (1, layouts::fp8_state_elements) each).
struct Fp8Workspace {
  layouts::Fp8Settings settings;
  Tensor input, input_t, grad, grad_t;
  const void* grad_source = nullptr;
  const void* grad_owner = nullptr;
};
struct Fp8LinearState {
  Tensor weight, weight_t;
  Tensor input_state, weight_state, grad_state, input_t_state;
  bool weight_cast = false;
};

// One linear layer of one layer of the model on this TP rank (Megatron's ColumnParallelLinear /
// RowParallelLinear with their mappings). The steps are separate calls, so that a layer interleaves its own
// work where Megatron does (the activation's backward between fc2's data and weight gradients); forward()
// and backward() run them all in Megatron's order. A step that the linear's parallelism has no collective
// for is the identity (a row-parallel input is already split over TP, a column-parallel output stays split).
// Ops are tagged with the layer; backward steps carry OpPhase::kBackward.
class TensorParallelLinear {
 public:
  // weight_spec: the weight's entry in layouts' parameter table (its split decides the parallelism).
  TensorParallelLinear(const layouts::ParameterSpec& weight_spec, const LinearParameters& parameters,
                       LinearLabels labels, int layer, const TensorParallelRegions& regions);

  LinearParallelism parallelism() const { return parallelism_; }
  const LinearParameters& parameters() const { return parameters_; }
  // Where its weight and gradient are now (FSDP optim_grads_params places the gathered weight per use).
  void set_parameters(const LinearParameters& parameters) { parameters_ = parameters; }
  // Runs this linear's GEMMs in FP8 (state and workspace outlive it; the model owns them). The casts are
  // ops of their own, labelled gemm + "_weight_fp8" / "_input_fp8" (forward), "_grad_fp8" (the output
  // gradient, with the bias gradient) and "_input_fp8t" (the weight gradient's input).
  void set_fp8(Fp8LinearState* state, Fp8Workspace* workspace) {
    fp8_ = state;
    fp8_workspace_ = workspace;
  }
  bool is_fp8() const { return fp8_ != nullptr; }

  // Column-parallel under SP: the input's (T / tp, in) shard all-gathered into x_full (returned); else x.
  Tensor gather_input(Tensor x, Tensor x_full, layouts::OpPhase phase) const;
  // y (T, out) = x . W^T + bias, or y += with accumulate. A row-parallel bias is added on TP rank 0 only
  // (once, before the reduction).
  void forward_gemm(Tensor x, Tensor y, layouts::OpPhase phase, bool accumulate = false) const;
  // The forward GEMM with GELU in its epilogue: pre = x . W^T + bias (kept for the backward), act =
  // gelu(pre).
  void forward_gemm_gelu(Tensor x, Tensor pre, Tensor act, layouts::OpPhase phase) const;
  // Row-parallel: the partial outputs summed over TP (TensorParallelRegions::reduce into shard); else
  // partial.
  Tensor reduce_output(Tensor partial, Tensor shard, layouts::OpPhase phase) const;
  // gather_input, forward_gemm into y, reduce_output into y_shard; returns the output.
  Tensor forward(Tensor x, Tensor x_full, Tensor y, Tensor y_shard, layouts::OpPhase phase) const;
  // A column-parallel linear with its output gathered (Megatron's gather_output; then under SP this rank's
  // sequence rows kept): gather_input, the GEMM into y_part (T, out / tp), its all-gather over TP through
  // `gathered` (tp * T, out / tp) into out (rows, out). At TP 1 the GEMM writes out.
  void forward_gathered_output(Tensor x, Tensor x_full, Tensor y_part, Tensor gathered, Tensor out,
                               layouts::OpPhase phase) const;

  // Row-parallel under SP: the output gradient's (T / tp, out) shard all-gathered into dy_full (returned);
  // else dy.
  Tensor gather_output_grad(Tensor dy, Tensor dy_full) const;
  // forward_gathered_output's backward: under SP d_out (rows, out) all-gathered into d_out_full (T, out);
  // returns this rank's columns of it (T, out / tp).
  Tensor gathered_output_grad(Tensor d_out, Tensor d_out_full) const;
  // dx (T, in) = dy . W, or dx += with accumulate.
  void data_grad(Tensor dy, Tensor dx, bool accumulate = false) const;
  // dW = dy^T . x into the fp32 gradient, the bias gradient fused; accumulate: added (the iteration's first
  // write overwrites).
  void weight_grad(Tensor dy, Tensor x, bool accumulate) const;
  // Column-parallel: the input gradient (T, in), partial over TP, summed (TensorParallelRegions::reduce into
  // dx_shard); else dx.
  Tensor reduce_input_grad(Tensor dx, Tensor dx_shard) const;
  // What backward() reads and writes: the output gradient as the layer holds it (and where it is gathered),
  // the saved input (and where it is gathered again), the input gradient (and its reduced shard).
  struct BackwardTensors {
    Tensor dy, dy_full, x, x_full, dx, dx_shard;
  };
  // gather_output_grad, gather_input, data_grad, weight_grad, reduce_input_grad; returns the input gradient.
  Tensor backward(const BackwardTensors& t, bool accumulate) const;

 private:
  OpTag tag(const std::string& label, layouts::OpPhase phase) const;
  std::int64_t storage_bytes(Tensor t) const;
  // FP8: the forward GEMM's arguments with the weight (when not yet this iteration) and x cast.
  GemmArgs fp8_forward_args(Tensor x, Tensor y, Tensor bias, layouts::OpPhase phase) const;
  // FP8: the output gradient dy cast (with the bias gradient) into the workspace; reuse: not when the
  // workspace holds this linear's cast of dy (data_grad casts, the weight_grad after it reuses).
  void fp8_cast_grad(Tensor dy, bool reuse) const;
  Tensor fp8_view(Tensor buffer, std::int64_t rows, std::int64_t cols) const;
  void cast(Tensor src, Tensor out, Tensor out_t, Tensor state, layouts::Fp8Encoding encoding,
            bool current_scaling, Tensor bias_grad, const std::string& label, layouts::OpPhase phase) const;

  LinearParallelism parallelism_;
  LinearParameters parameters_;
  LinearLabels labels_;  // resolved: no empty label
  std::string dgrad_label_, wgrad_label_;
  int layer_;
  TensorParallelRegions regions_;
  Fp8LinearState* fp8_ = nullptr;
  Fp8Workspace* fp8_workspace_ = nullptr;
  std::string weight_fp8_label_, input_fp8_label_, grad_fp8_label_, input_fp8t_label_;
};

// The local experts' fc1s or fc2s of one MoE layer (fc1 column-, fc2 row-parallel over the
// expert-tensor-parallel group, whose gathers and reduce-scatters the MoE dispatcher issues for all experts
// at once). Expert e works on rows [offsets[e], offsets[e + 1]) of the row buffers; each pass is one grouped
// GEMM over the experts that have rows (none when no expert has).
class ExpertLinears {
 public:
  ExpertLinears(std::vector<LinearParameters> experts, std::string label, int layer, Backend& backend);
  const std::vector<LinearParameters>& parameters() const { return experts_; }
  void set_parameters(const std::vector<LinearParameters>& experts) { experts_ = experts; }

  void forward(Tensor x, Tensor y, const std::vector<std::int64_t>& offsets, layouts::OpPhase phase) const;
  void data_grad(Tensor dy, Tensor dx, const std::vector<std::int64_t>& offsets) const;
  // Without accumulate (the iteration's first write) an expert without rows gets a zero gradient.
  void weight_grad(Tensor dy, Tensor x, const std::vector<std::int64_t>& offsets, bool accumulate) const;

 private:
  Tensor rows(Tensor t, std::int64_t first, std::int64_t count) const;
  void check(const std::vector<std::int64_t>& offsets) const;  // one more offset than experts
  // One grouped GEMM of gemm(expert, first row, rows) over the experts with rows.
  using ExpertGemm = std::function<GemmArgs(const LinearParameters&, std::int64_t, std::int64_t)>;
  void grouped(const std::string& label, layouts::OpPhase phase, const std::vector<std::int64_t>& offsets,
               const ExpertGemm& gemm) const;

  std::vector<LinearParameters> experts_;
  std::string label_, dgrad_label_, wgrad_label_;
  int layer_;
  Backend* backend_;
};

}  // namespace megatune::executor
