// GPTModel's FP8 linears (layouts/fp8.h): the dense attention's QKV and output projection and the dense MLP's
// fc1 and fc2 of every layer of the stage run their GEMMs in FP8. Each gets its weight's FP8 copy and
// transpose and four scaling states; the model shares one set of cast buffers, as large as the largest
// linear's input and output gradient (a cast lives only until the GEMMs that read it).
#include <algorithm>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "executor/model/gpt_model.h"

namespace megatune::executor {

void GPTModel::setup_fp8() {
  std::vector<TensorParallelLinear*> linears;
  for (LayerLinears& lin : layer_linears_)
    for (std::optional<TensorParallelLinear>* l : {&lin.qkv, &lin.proj, &lin.fc1, &lin.fc2})
      if (l->has_value()) linears.push_back(&**l);
  if (linears.empty()) return;
  const std::int64_t T = shape_.tokens;
  // Hopper's FP8 GEMMs need every dimension a multiple of 16 (cuBLASLt's FP8 requirement); the CPU backend
  // emulates the same GEMMs and is held to the same shapes.
  auto require16 = [](std::int64_t size, const std::string& what) {
    if (size % 16 != 0)
      throw UserError("--fp8-format: " + what + " is " + std::to_string(size) +
                      ", FP8 GEMMs need multiples of 16; change the model or micro-batch shape, or train "
                      "without --fp8-format");
  };
  require16(T, "the micro-batch's tokens per rank (micro-batch x sequence / context-parallel size)");
  std::int64_t max_in = 0, max_out = 0;
  for (const TensorParallelLinear* l : linears) {
    const Tensor& w = l->parameters().weight;
    require16(w.rows, "a linear layer's output features per rank");
    require16(w.cols, "a linear layer's input features per rank");
    max_in = std::max(max_in, w.cols);
    max_out = std::max(max_out, w.rows);
  }
  fp8_workspace_ = std::make_unique<Fp8Workspace>();
  Fp8Workspace& ws = *fp8_workspace_;
  ws.settings = config_.fp8;
  ws.input = backend_.allocate(DType::kFP8, T, max_in, "FP8 casts of linear inputs");
  ws.input_t = backend_.allocate(DType::kFP8, max_in, T, "FP8 casts of linear inputs");
  ws.grad = backend_.allocate(DType::kFP8, T, max_out, "FP8 casts of linear output gradients");
  ws.grad_t = backend_.allocate(DType::kFP8, max_out, T, "FP8 casts of linear output gradients");

  const std::int64_t state_elements = layouts::fp8_state_elements(config_.fp8);
  constexpr int kStatesPerLinear = 4;
  Tensor states = backend_.allocate(
      DType::kFP32, 1, state_elements * kStatesPerLinear * static_cast<std::int64_t>(linears.size()),
      "FP8 scaling states");
  if (states.data != nullptr) {  // scale 1, nothing pending, an empty history
    std::vector<float> initial(static_cast<std::size_t>(states.numel()), 0.0f);
    for (std::size_t i = 0; i < initial.size(); i += static_cast<std::size_t>(state_elements))
      initial[i + layouts::kFp8Scale] = initial[i + layouts::kFp8ScaleInv] = 1.0f;
    backend_.upload(states, initial.data());
  }
  fp8_states_.resize(linears.size());
  std::int64_t next = 0;
  auto state = [&] {
    const Tensor t = carve(states, next, 1, state_elements, 4);
    next += state_elements;
    return t;
  };
  for (std::size_t i = 0; i < linears.size(); ++i) {
    Fp8LinearState& s = fp8_states_[i];
    const Tensor& w = linears[i]->parameters().weight;
    s.weight = backend_.allocate(DType::kFP8, w.rows, w.cols, "FP8 weight copies");
    s.weight_t = backend_.allocate(DType::kFP8, w.cols, w.rows, "FP8 weight copies");
    s.input_state = state();
    s.weight_state = state();
    s.grad_state = state();
    s.input_t_state = state();
    linears[i]->set_fp8(&s, &ws);
  }
}

}  // namespace megatune::executor
