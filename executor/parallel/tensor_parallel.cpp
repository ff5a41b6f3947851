// Tensor-parallel regions, linear layers and the local experts' grouped linears: their GEMMs and collectives.
#include "executor/parallel/tensor_parallel.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace megatune::executor {
namespace {

using layouts::OpPhase;
constexpr OpPhase kB = OpPhase::kBackward;
constexpr layouts::OpRole kTpRole = layouts::OpRole::kTensorParallel;

std::string or_default(const std::string& label, std::string fallback) {
  return label.empty() ? std::move(fallback) : label;
}

}  // namespace

GemmArgs linear_forward_args(Tensor x, Tensor weight, Tensor y, Tensor bias, std::int64_t m) {
  return {.a = x,
          .b = weight,
          .transpose_b = true,
          .c = y,
          .bias = bias,
          .m = m,
          .n = weight.rows,
          .k = weight.cols};
}

GemmArgs linear_data_grad_args(Tensor dy, Tensor weight, Tensor dx, std::int64_t m) {
  return {.a = dy, .b = weight, .c = dx, .m = m, .n = weight.cols, .k = weight.rows};
}

GemmArgs linear_weight_grad_args(Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias,
                                 std::int64_t tokens) {
  return {.a = dy,
          .transpose_a = true,
          .b = x,
          .c = d_weight,
          .bias_grad = d_bias,
          .m = weight.rows,
          .n = weight.cols,
          .k = tokens,
          .accumulate = true};
}

TensorParallelRegions::TensorParallelRegions(Backend& backend, Communicator& communicator,
                                             bool sequence_parallel)
    : backend_(&backend),
      communicator_(&communicator),
      rank_(communicator.rank(CommGroup::kTensor)),
      size_(communicator.size(CommGroup::kTensor)),
      sequence_parallel_(sequence_parallel && size_ > 1) {}

Tensor TensorParallelRegions::gather_sequence(Tensor shard, Tensor full, const char* label, int layer,
                                              OpPhase phase) const {
  if (!sequence_parallel_) return shard;
  communicator_->all_gather(CommGroup::kTensor, shard, full, {label, layer, phase, kTpRole});
  return full;
}

Tensor TensorParallelRegions::reduce(Tensor partial, Tensor shard, const char* all_reduce_label,
                                     const char* reduce_scatter_label, int layer, OpPhase phase) const {
  if (size_ == 1) return partial;
  if (sequence_parallel_) {
    communicator_->reduce_scatter(CommGroup::kTensor, partial, shard,
                                  {reduce_scatter_label, layer, phase, kTpRole});
    return shard;
  }
  communicator_->all_reduce(CommGroup::kTensor, partial, ReduceOp::kSum,
                            {all_reduce_label, layer, phase, kTpRole});
  return partial;
}

void TensorParallelRegions::gather_features(Tensor part, Tensor gathered, Tensor out, const char* label,
                                            int layer, OpPhase phase) const {
  if (size_ == 1) {
    backend_->copy(part, out);
    return;
  }
  communicator_->all_gather(CommGroup::kTensor, part, gathered, {label, layer, phase, kTpRole});
  const std::int64_t storage = backend_->storage_bytes(part.dtype), tokens = part.rows, cols = part.cols;
  const std::int64_t first = sequence_parallel_ ? rank_ * out.rows : 0;
  for (int r = 0; r < size_; ++r)
    backend_->copy(rows_of(gathered, r * tokens + first, out.rows, storage),
                   columns_of(out, r * cols, cols, storage));
}

LinearParallelism linear_parallelism(const layouts::ParameterSpec& weight) {
  switch (weight.split) {
    case layouts::TensorParallelSplit::kRows:
      return LinearParallelism::kColumn;
    case layouts::TensorParallelSplit::kColumns:
      return LinearParallelism::kRow;
    case layouts::TensorParallelSplit::kReplicated:
      break;
  }
  return LinearParallelism::kReplicated;
}

TensorParallelLinear::TensorParallelLinear(const layouts::ParameterSpec& weight_spec,
                                           const LinearParameters& parameters, LinearLabels labels, int layer,
                                           const TensorParallelRegions& regions)
    : parallelism_(linear_parallelism(weight_spec)),
      parameters_(parameters),
      labels_(std::move(labels)),
      layer_(layer),
      regions_(regions) {
  if (labels_.gemm.empty())
    throw std::logic_error("TensorParallelLinear: " + weight_spec.name + " has no label");
  const std::string& g = labels_.gemm;
  const bool row = parallelism_ == LinearParallelism::kRow;
  labels_.input_gather = or_default(labels_.input_gather, g + "_input_ag");
  labels_.reduce_all_reduce = or_default(labels_.reduce_all_reduce, g + (row ? "_ar" : "_dgrad_ar"));
  labels_.reduce_scatter = or_default(labels_.reduce_scatter, g + (row ? "_rs" : "_dgrad_rs"));
  labels_.grad_gather = or_default(labels_.grad_gather, g + "_grad_ag");
  labels_.output_gather = or_default(labels_.output_gather, g + "_output_ag");
  dgrad_label_ = g + "_dgrad";
  wgrad_label_ = g + "_wgrad";
  weight_fp8_label_ = g + "_weight_fp8";
  input_fp8_label_ = g + "_input_fp8";
  grad_fp8_label_ = g + "_grad_fp8";
  input_fp8t_label_ = g + "_input_fp8t";
}

OpTag TensorParallelLinear::tag(const std::string& label, OpPhase phase) const {
  return {label.c_str(), layer_, phase};
}

std::int64_t TensorParallelLinear::storage_bytes(Tensor t) const {
  return regions_.backend().storage_bytes(t.dtype);
}

Tensor TensorParallelLinear::fp8_view(Tensor buffer, std::int64_t rows, std::int64_t cols) const {
  return carve(buffer, 0, rows, cols, regions_.backend().storage_bytes(DType::kFP8));
}

void TensorParallelLinear::cast(Tensor src, Tensor out, Tensor out_t, Tensor state,
                                layouts::Fp8Encoding encoding, bool current_scaling, Tensor bias_grad,
                                const std::string& label, OpPhase phase) const {
  const layouts::Fp8Settings& s = fp8_workspace_->settings;
  Fp8CastArgs args{.src = src,
                   .out = out,
                   .out_transposed = out_t,
                   .encoding = encoding,
                   .state = state,
                   .current_scaling = current_scaling,
                   .margin = s.margin,
                   .history_len = s.amax_history_len,
                   .amax_max = s.amax_max,
                   .bias_grad = bias_grad};
  regions_.backend().fp8_cast(args, tag(label, phase));
}

namespace {
Tensor scale_inv_of(Tensor state) { return carve(state, layouts::kFp8ScaleInv, 1, 1, 4); }
}  // namespace

GemmArgs TensorParallelLinear::fp8_forward_args(Tensor x, Tensor y, Tensor bias, OpPhase phase) const {
  const layouts::Fp8Settings& s = fp8_workspace_->settings;
  const bool current = s.recipe == layouts::Fp8Recipe::kTensorwise;
  const layouts::Fp8Encoding e = s.forward_encoding();
  const Tensor& w = parameters_.weight;
  if (!fp8_->weight_cast) {  // once per iteration, at its first forward
    cast(w, fp8_->weight, fp8_->weight_t, fp8_->weight_state, e, current, {}, weight_fp8_label_, phase);
    fp8_->weight_cast = true;
  }
  const Tensor x8 = fp8_view(fp8_workspace_->input, x.rows, x.cols);
  cast(x, x8, {}, fp8_->input_state, e, current, {}, input_fp8_label_, phase);
  GemmArgs args = linear_forward_args(x8, fp8_->weight, y, bias, x.rows);
  args.a_encoding = args.b_encoding = e;
  args.a_scale_inv = scale_inv_of(fp8_->input_state);
  args.b_scale_inv = scale_inv_of(fp8_->weight_state);
  args.fast_accumulate = true;
  return args;
}

void TensorParallelLinear::fp8_cast_grad(Tensor dy, bool reuse) const {
  Fp8Workspace& ws = *fp8_workspace_;
  if (reuse && ws.grad_source == dy.data && ws.grad_owner == fp8_) return;
  const layouts::Fp8Settings& s = ws.settings;
  cast(dy, fp8_view(ws.grad, dy.rows, dy.cols), fp8_view(ws.grad_t, dy.cols, dy.rows), fp8_->grad_state,
       s.gradient_encoding(), s.recipe == layouts::Fp8Recipe::kTensorwise, parameters_.d_bias,
       grad_fp8_label_, kB);
  ws.grad_source = dy.data;
  ws.grad_owner = fp8_;
}

Tensor TensorParallelLinear::gather_input(Tensor x, Tensor x_full, OpPhase phase) const {
  if (parallelism_ != LinearParallelism::kColumn) return x;
  return regions_.gather_sequence(x, x_full, labels_.input_gather.c_str(), layer_, phase);
}

void TensorParallelLinear::forward_gemm(Tensor x, Tensor y, OpPhase phase, bool accumulate) const {
  // A row-parallel bias is added once: on TP rank 0, before the reduction.
  const bool bias = parallelism_ != LinearParallelism::kRow || regions_.rank() == 0;
  const Tensor b = bias ? parameters_.bias : Tensor{};
  GemmArgs args =
      fp8_ ? fp8_forward_args(x, y, b, phase) : linear_forward_args(x, parameters_.weight, y, b, x.rows);
  args.accumulate = accumulate;
  regions_.backend().gemm(args, tag(labels_.gemm, phase));
}

void TensorParallelLinear::forward_gemm_gelu(Tensor x, Tensor pre, Tensor act, OpPhase phase) const {
  if (parallelism_ == LinearParallelism::kRow)
    throw std::logic_error("forward_gemm_gelu: a row-parallel output is partial; GELU needs the sum");
  regions_.backend().linear_gelu_forward(
      fp8_ ? fp8_forward_args(x, pre, parameters_.bias, phase)
           : linear_forward_args(x, parameters_.weight, pre, parameters_.bias, x.rows),
      act, tag(labels_.gemm, phase));
}

Tensor TensorParallelLinear::reduce_output(Tensor partial, Tensor shard, OpPhase phase) const {
  if (parallelism_ != LinearParallelism::kRow) return partial;
  return regions_.reduce(partial, shard, labels_.reduce_all_reduce.c_str(), labels_.reduce_scatter.c_str(),
                         layer_, phase);
}

Tensor TensorParallelLinear::forward(Tensor x, Tensor x_full, Tensor y, Tensor y_shard, OpPhase phase) const {
  forward_gemm(gather_input(x, x_full, phase), y, phase);
  return reduce_output(y, y_shard, phase);
}

void TensorParallelLinear::forward_gathered_output(Tensor x, Tensor x_full, Tensor y_part, Tensor gathered,
                                                   Tensor out, OpPhase phase) const {
  if (parallelism_ != LinearParallelism::kColumn)
    throw std::logic_error("forward_gathered_output: only a column-parallel output is gathered");
  const Tensor input = gather_input(x, x_full, phase);
  if (regions_.size() == 1) {
    forward_gemm(input, out, phase);
    return;
  }
  forward_gemm(input, y_part, phase);
  regions_.gather_features(y_part, gathered, out, labels_.output_gather.c_str(), layer_, phase);
}

Tensor TensorParallelLinear::gather_output_grad(Tensor dy, Tensor dy_full) const {
  if (parallelism_ != LinearParallelism::kRow) return dy;
  return regions_.gather_sequence(dy, dy_full, labels_.grad_gather.c_str(), layer_, kB);
}

Tensor TensorParallelLinear::gathered_output_grad(Tensor d_out, Tensor d_out_full) const {
  if (parallelism_ != LinearParallelism::kColumn)
    throw std::logic_error("gathered_output_grad: only a column-parallel output is gathered");
  const Tensor full = regions_.gather_sequence(d_out, d_out_full, labels_.grad_gather.c_str(), layer_, kB);
  if (regions_.size() == 1) return full;
  const std::int64_t part = parameters_.weight.rows;
  return columns_of(full, regions_.rank() * part, part, storage_bytes(full));
}

void TensorParallelLinear::data_grad(Tensor dy, Tensor dx, bool accumulate) const {
  GemmArgs args;
  if (fp8_) {
    // dx = dy . W as FP8 operands with the reduction dimension (out) contiguous: dy (m, out), W^T (in, out).
    fp8_cast_grad(dy, /*reuse=*/false);
    const Tensor& w = parameters_.weight;
    args = {.a = fp8_view(fp8_workspace_->grad, dy.rows, dy.cols),
            .b = fp8_->weight_t,
            .transpose_b = true,
            .c = dx,
            .m = dy.rows,
            .n = w.cols,
            .k = w.rows};
    args.a_encoding = fp8_workspace_->settings.gradient_encoding();
    args.b_encoding = fp8_workspace_->settings.forward_encoding();
    args.a_scale_inv = scale_inv_of(fp8_->grad_state);
    args.b_scale_inv = scale_inv_of(fp8_->weight_state);
  } else {
    args = linear_data_grad_args(dy, parameters_.weight, dx, dy.rows);
  }
  args.accumulate = accumulate;
  regions_.backend().gemm(args, tag(dgrad_label_, kB));
}

void TensorParallelLinear::weight_grad(Tensor dy, Tensor x, bool accumulate) const {
  GemmArgs args;
  if (fp8_) {
    // dW = dy^T . x as FP8 operands with the tokens contiguous: dy^T (out, m), x^T (in, m). The input is cast
    // again from the saved activation, with its own amax (Transformer Engine keeps the forward's cast).
    fp8_cast_grad(dy, /*reuse=*/true);
    fp8_workspace_->grad_source = nullptr;  // the pair of GEMMs reading this cast ends here
    const layouts::Fp8Settings& s = fp8_workspace_->settings;
    const Tensor xt = fp8_view(fp8_workspace_->input_t, x.cols, x.rows);
    cast(x, {}, xt, fp8_->input_t_state, s.forward_encoding(), /*current_scaling=*/true, {},
         input_fp8t_label_, kB);
    const Tensor& w = parameters_.weight;
    args = {.a = fp8_view(fp8_workspace_->grad_t, dy.cols, dy.rows),
            .b = xt,
            .transpose_b = true,
            .c = parameters_.d_weight,
            .m = w.rows,
            .n = w.cols,
            .k = dy.rows};
    args.a_encoding = s.gradient_encoding();
    args.b_encoding = s.forward_encoding();
    args.a_scale_inv = scale_inv_of(fp8_->grad_state);
    args.b_scale_inv = scale_inv_of(fp8_->input_t_state);
  } else {
    args =
        linear_weight_grad_args(dy, x, parameters_.weight, parameters_.d_weight, parameters_.d_bias, dy.rows);
  }
  args.accumulate = accumulate;
  regions_.backend().gemm(args, tag(wgrad_label_, kB));
}

Tensor TensorParallelLinear::reduce_input_grad(Tensor dx, Tensor dx_shard) const {
  if (parallelism_ != LinearParallelism::kColumn) return dx;
  return regions_.reduce(dx, dx_shard, labels_.reduce_all_reduce.c_str(), labels_.reduce_scatter.c_str(),
                         layer_, kB);
}

Tensor TensorParallelLinear::backward(const BackwardTensors& t, bool accumulate) const {
  const Tensor dy = gather_output_grad(t.dy, t.dy_full);
  const Tensor x = gather_input(t.x, t.x_full, kB);
  data_grad(dy, t.dx);
  weight_grad(dy, x, accumulate);
  return reduce_input_grad(t.dx, t.dx_shard);
}

ExpertLinears::ExpertLinears(std::vector<LinearParameters> experts, std::string label, int layer,
                             Backend& backend)
    : experts_(std::move(experts)),
      label_(std::move(label)),
      dgrad_label_(label_ + "_dgrad"),
      wgrad_label_(label_ + "_wgrad"),
      layer_(layer),
      backend_(&backend) {}

Tensor ExpertLinears::rows(Tensor t, std::int64_t first, std::int64_t count) const {
  return rows_of(t, first, count, backend_->storage_bytes(t.dtype));
}

void ExpertLinears::check(const std::vector<std::int64_t>& offsets) const {
  if (offsets.size() != experts_.size() + 1)
    throw std::logic_error("ExpertLinears " + label_ + ": " + std::to_string(offsets.size()) +
                           " row offsets for " + std::to_string(experts_.size()) + " experts");
}

void ExpertLinears::grouped(const std::string& label, OpPhase phase, const std::vector<std::int64_t>& offsets,
                            const ExpertGemm& gemm) const {
  check(offsets);
  std::vector<GemmArgs> gemms;
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    const std::int64_t first = offsets[e], n = offsets[e + 1] - first;
    if (n > 0) gemms.push_back(gemm(experts_[e], first, n));
  }
  if (!gemms.empty()) backend_->grouped_gemm(gemms, {label.c_str(), layer_, phase});
}

void ExpertLinears::forward(Tensor x, Tensor y, const std::vector<std::int64_t>& offsets,
                            OpPhase phase) const {
  grouped(label_, phase, offsets, [&](const LinearParameters& p, std::int64_t first, std::int64_t n) {
    return linear_forward_args(rows(x, first, n), p.weight, rows(y, first, n), {}, n);
  });
}

void ExpertLinears::data_grad(Tensor dy, Tensor dx, const std::vector<std::int64_t>& offsets) const {
  grouped(dgrad_label_, kB, offsets, [&](const LinearParameters& p, std::int64_t first, std::int64_t n) {
    return linear_data_grad_args(rows(dy, first, n), p.weight, rows(dx, first, n), n);
  });
}

void ExpertLinears::weight_grad(Tensor dy, Tensor x, const std::vector<std::int64_t>& offsets,
                                bool accumulate) const {
  check(offsets);
  for (std::size_t e = 0; e < experts_.size(); ++e)
    if (offsets[e + 1] == offsets[e] && !accumulate) backend_->fill_zero(experts_[e].d_weight);
  grouped(wgrad_label_, kB, offsets, [&](const LinearParameters& p, std::int64_t first, std::int64_t n) {
    GemmArgs args =
        linear_weight_grad_args(rows(dy, first, n), rows(x, first, n), p.weight, p.d_weight, {}, n);
    args.accumulate = accumulate;
    return args;
  });
}

}  // namespace megatune::executor
