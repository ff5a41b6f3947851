// GemmRunner: row-major GEMMs mapped onto column-major cuBLASLt, with a plan cache per spec and alignment.
//
// Row-major D[m, n] = op(A) . op(B) is column-major D^T[n, m] = op(B)^T . op(A)^T, so cuBLASLt sees
// "A" = our B (transa = our trans_b), "B" = our A (transb = our trans_a), m' = n, n' = m, k' = k. A
// row-major matrix stored [r, c] with row stride ld is a column-major [c, r] matrix with the same ld.
#include "executor/cuda/gemm_runner.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "executor/cuda/cuda_check.h"

namespace megatune::executor::cuda {

struct GemmRunner::Plan {
  GemmSpec spec;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLAS "A" = our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLAS "B" = our A
  cublasLtMatrixLayout_t layout_d = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's top choices, best first
  Key key{};
  bool tuned = false;

  ~Plan() {
    if (layout_d) cublasLtMatrixLayoutDestroy(layout_d);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }
};

namespace {

cudaDataType_t data_type(GemmDType type) {
  switch (type) {
    case GemmDType::kBF16:
      return CUDA_R_16BF;
    case GemmDType::kFP32:
      return CUDA_R_32F;
    case GemmDType::kFP8E4M3:
      return CUDA_R_8F_E4M3;
    case GemmDType::kFP8E5M2:
      return CUDA_R_8F_E5M2;
  }
  return CUDA_R_16BF;
}

cublasLtEpilogue_t epilogue_of(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGeluBGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kBGradA:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kNone:
      return "none";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kGeluAux:
      return "gelu_aux";
    case GemmEpilogue::kGeluAuxBias:
      return "gelu_aux_bias";
    case GemmEpilogue::kDGeluBGrad:
      return "dgelu_bgrad";
    case GemmEpilogue::kDGelu:
      return "dgelu";
    case GemmEpilogue::kBGradA:
      return "bgrad_a";
  }
  return "?";
}

// Fills packed leading dimensions and strides; validates.
GemmSpec resolved(GemmSpec spec) {
  if (spec.m <= 0 || spec.n <= 0 || spec.k <= 0 || spec.batch_count <= 0)
    throw std::invalid_argument("GemmSpec: m, n, k and batch_count must be positive");
  const int64_t a_cols = spec.trans_a ? spec.m : spec.k, a_rows = spec.trans_a ? spec.k : spec.m;
  const int64_t b_cols = spec.trans_b ? spec.k : spec.n, b_rows = spec.trans_b ? spec.n : spec.k;
  if (spec.lda == 0) spec.lda = a_cols;
  if (spec.ldb == 0) spec.ldb = b_cols;
  if (spec.ldd == 0) spec.ldd = spec.n;
  if (spec.ld_aux == 0) spec.ld_aux = spec.n;
  if (spec.lda < a_cols || spec.ldb < b_cols || spec.ldd < spec.n || spec.ld_aux < spec.n)
    throw std::invalid_argument("GemmSpec: a leading dimension is smaller than its row length");
  if (is_fp8(spec.ab_type)) {
    if (!is_fp8(spec.b_type) || spec.trans_a || !spec.trans_b)
      throw std::invalid_argument("GemmSpec: FP8 A and B, A stored [m, k] and B [n, k]");
    if (spec.ab_type == GemmDType::kFP8E5M2 && spec.b_type == GemmDType::kFP8E5M2)
      throw std::invalid_argument("GemmSpec: cuBLASLt has no E5M2 x E5M2 GEMM");
  } else {
    spec.b_type = spec.ab_type;
    spec.fast_accumulate = false;
  }
  if (spec.batch_count > 1) {
    if (spec.stride_a == 0) spec.stride_a = a_rows * spec.lda;
    if (spec.stride_b == 0) spec.stride_b = b_rows * spec.ldb;
    if (spec.stride_d == 0) spec.stride_d = spec.m * spec.ldd;
  }
  return spec;
}

int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const void* value,
                   size_t bytes) {
  MEGATUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, value, bytes));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  MEGATUNE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    MEGATUNE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    MEGATUNE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

}  // namespace

GemmSpec GemmSpec::linear_forward(int64_t m, int64_t n, int64_t k) {
  GemmSpec spec;
  spec.m = m, spec.n = n, spec.k = k, spec.trans_b = true;
  return spec;
}

GemmSpec GemmSpec::linear_backward_data(int64_t m, int64_t n, int64_t k) {
  GemmSpec spec;  // dx [m, k] = dy [m, n] . w [n, k]: GEMM (m, k, n)
  spec.m = m, spec.n = k, spec.k = n;
  return spec;
}

GemmSpec GemmSpec::linear_backward_weight(int64_t m, int64_t n, int64_t k, GemmDType dw_type) {
  GemmSpec spec;  // dw [n, k] = dy^T [n, m] . x [m, k]: GEMM (n, k, m), A = dy stored [m, n]
  spec.m = n, spec.n = k, spec.k = m, spec.trans_a = true, spec.d_type = dw_type;
  return spec;
}

GemmRunner::GemmRunner(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  MEGATUNE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) MEGATUNE_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

GemmRunner::Key GemmRunner::key_of(const GemmSpec& s, int alignment_bytes, bool ragged) {
  return Key{s.m,
             s.n,
             s.k,
             (int64_t(s.trans_a) << 1) | int64_t(s.trans_b),
             s.lda,
             s.ldb,
             s.ldd,
             s.ld_aux,
             int64_t(s.ab_type),
             int64_t(s.d_type),
             int64_t(s.epilogue),
             s.batch_count,
             s.stride_a,
             s.stride_b,
             s.stride_d,
             alignment_bytes,
             int64_t(ragged),
             int64_t(s.b_type),
             int64_t(s.fast_accumulate)};
}

GemmRunner::Plan& GemmRunner::plan_for(const GemmSpec& raw_spec, int alignment_bytes, bool ragged) {
  const GemmSpec spec = resolved(raw_spec);
  const Key key = key_of(spec, alignment_bytes, ragged);
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;

  auto plan = std::make_unique<Plan>();
  plan->spec = spec;
  MEGATUNE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = spec.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = our B
  const cublasOperation_t trans_b = spec.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS B = our A
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a);
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b);
  const cublasLtEpilogue_t epilogue = epilogue_of(spec.epilogue);
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
  if (spec.epilogue == GemmEpilogue::kGeluAux || spec.epilogue == GemmEpilogue::kGeluAuxBias ||
      spec.epilogue == GemmEpilogue::kDGeluBGrad || spec.epilogue == GemmEpilogue::kDGelu) {
    const int64_t ld_aux = spec.ld_aux;
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux);
    if (spec.batch_count > 1) {
      const int64_t aux_stride = spec.m * spec.ld_aux;
      set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride,
                    sizeof aux_stride);
    }
  }

  if (spec.fast_accumulate) {
    const int8_t fast = 1;
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
  }
  if (is_fp8(spec.ab_type) && workspace_ != nullptr) {
    // Per-tensor scales are part of the operation the heuristic picks for: the algorithm is chosen with
    // scale pointers set (any device address here; run() sets each call's own).
    const void* placeholder = workspace_;
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder, sizeof placeholder);
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder, sizeof placeholder);
  }
  const cudaDataType_t a_type = data_type(spec.ab_type), b_type = data_type(spec.b_type),
                       d = data_type(spec.d_type);
  // Our B stored [k, n] (or [n, k] transposed) = column-major [n, k] (or [k, n]).
  plan->layout_a = spec.trans_b
                       ? make_layout(b_type, spec.k, spec.n, spec.ldb, spec.batch_count, spec.stride_b)
                       : make_layout(b_type, spec.n, spec.k, spec.ldb, spec.batch_count, spec.stride_b);
  plan->layout_b = spec.trans_a
                       ? make_layout(a_type, spec.m, spec.k, spec.lda, spec.batch_count, spec.stride_a)
                       : make_layout(a_type, spec.k, spec.m, spec.lda, spec.batch_count, spec.stride_a);
  plan->layout_d = make_layout(d, spec.n, spec.m, spec.ldd, spec.batch_count, spec.stride_d);

  cublasLtMatmulPreference_t preference = nullptr;
  MEGATUNE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = workspace_bytes_;
  const uint32_t alignment = uint32_t(alignment_bytes);
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  for (auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment);
  }
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found_count = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->operation, plan->layout_a, plan->layout_b,
                                            plan->layout_d, plan->layout_d, preference, kTuneCandidates,
                                            results, &found_count);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || found_count == 0) {
    throw std::runtime_error(
        std::string(__FILE__) + ":" + std::to_string(__LINE__) +
        ": cuBLASLt has no algorithm for GEMM m=" + std::to_string(spec.m) + " n=" + std::to_string(spec.n) +
        " k=" + std::to_string(spec.k) + " epilogue=" + epilogue_name(spec.epilogue) +
        " alignment=" + std::to_string(alignment_bytes) + ": run it without the fused epilogue");
  }
  plan->algorithm = results[0].algo;
  for (int i = 0; i < found_count; ++i) plan->candidates.push_back(results[i].algo);
  plan->key = key;
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void GemmRunner::prepare(const GemmSpec& spec, int alignment_bytes) { plan_for(spec, alignment_bytes); }

bool GemmRunner::supports(const GemmSpec& raw_spec, const GemmArgs& args) {
  const GemmSpec spec = resolved(raw_spec);
  const GemmEpilogue e = spec.epilogue;
  const bool uses_aux = e == GemmEpilogue::kGeluAux || e == GemmEpilogue::kGeluAuxBias ||
                        e == GemmEpilogue::kDGeluBGrad || e == GemmEpilogue::kDGelu;
  const bool uses_bias = e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias;
  const bool uses_bias_grad = e == GemmEpilogue::kDGeluBGrad || e == GemmEpilogue::kBGradA;
  if (uses_aux && (args.aux == nullptr || spec.ld_aux % 8 != 0 || pointer_alignment(args.aux) < 16))
    return false;
  if (uses_bias && (args.bias == nullptr || pointer_alignment(args.bias) < 16)) return false;
  if (uses_bias_grad && (args.bias_grad == nullptr || pointer_alignment(args.bias_grad) < 16)) return false;
  const int alignment =
      std::min({pointer_alignment(args.a), pointer_alignment(args.b), pointer_alignment(args.d)});
  const Key key = key_of(spec, alignment);
  if (unsupported_.count(key) != 0) return false;
  if (plans_.count(key) != 0) return true;
  try {
    plan_for(spec, alignment);
    return true;
  } catch (const std::runtime_error&) {
    unsupported_.emplace(key, true);
    return false;
  }
}

void GemmRunner::run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  int alignment = std::min({pointer_alignment(args.a), pointer_alignment(args.b), pointer_alignment(args.d)});
  Plan& plan = plan_for(spec, alignment);
  const GemmEpilogue epilogue = plan.spec.epilogue;
  if (epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kGeluAuxBias) {
    if (args.bias == nullptr) throw std::invalid_argument("GemmRunner::run: bias epilogues need args.bias");
    set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias, sizeof args.bias);
  }
  if (epilogue == GemmEpilogue::kGeluAux || epilogue == GemmEpilogue::kGeluAuxBias ||
      epilogue == GemmEpilogue::kDGeluBGrad || epilogue == GemmEpilogue::kDGelu) {
    if (args.aux == nullptr) throw std::invalid_argument("GemmRunner::run: GELU epilogues need args.aux");
    set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &args.aux, sizeof args.aux);
  }
  if (epilogue == GemmEpilogue::kDGeluBGrad || epilogue == GemmEpilogue::kBGradA) {
    if (args.bias_grad == nullptr)
      throw std::invalid_argument("GemmRunner::run: bias-gradient epilogues need args.bias_grad");
    set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias_grad, sizeof args.bias_grad);
  }
  if (is_fp8(plan.spec.ab_type)) {  // cuBLAS's A is our B
    if (args.a_scale == nullptr || args.b_scale == nullptr)
      throw std::invalid_argument("GemmRunner::run: FP8 GEMMs need both operands' scales");
    set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &args.b_scale, sizeof args.b_scale);
    set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &args.a_scale, sizeof args.a_scale);
  }
  if (!plan.tuned) tune(plan, args, stream);
  MEGATUNE_CUBLAS_CHECK(matmul(plan, args, plan.algorithm, stream));
}

int64_t GemmRunner::ragged_bucket(int64_t size) {
  int64_t octave = 1;
  while (octave * 2 <= size) octave *= 2;
  const int64_t step = std::max<int64_t>(128, octave / 8);
  return (size + step - 1) / step * step;
}

void GemmRunner::run_ragged(const GemmSpec& raw_spec, const GemmArgs& args, cudaStream_t stream) {
  const GemmSpec spec = resolved(raw_spec);
  if (spec.epilogue != GemmEpilogue::kNone || spec.batch_count != 1 || (spec.trans_a && spec.trans_b)) {
    run(spec, args, stream);
    return;
  }
  GemmSpec bucket = spec;
  (spec.trans_a ? bucket.k : bucket.m) = ragged_bucket(spec.trans_a ? spec.k : spec.m);
  const int alignment =
      std::min({pointer_alignment(args.a), pointer_alignment(args.b), pointer_alignment(args.d)});
  Plan& plan = plan_for(bucket, alignment, /*ragged=*/true);
  // This call's sizes on the bucket's layouts (column-major views as in plan_for).
  auto set_shape = [](cublasLtMatrixLayout_t layout, int64_t rows, int64_t cols) {
    const uint64_t r = uint64_t(rows), c = uint64_t(cols);
    MEGATUNE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof r));
    MEGATUNE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof c));
  };
  spec.trans_b ? set_shape(plan.layout_a, spec.k, spec.n) : set_shape(plan.layout_a, spec.n, spec.k);
  spec.trans_a ? set_shape(plan.layout_b, spec.m, spec.k) : set_shape(plan.layout_b, spec.k, spec.m);
  set_shape(plan.layout_d, spec.n, spec.m);
  // The heuristic's first choice, untimed: counts drift from step to step, and timing candidates on each
  // newly seen bucket (a stream wait per round) stalled the training step's first tens of iterations.
  plan.tuned = true;
  const cublasStatus_t status = matmul(plan, args, plan.algorithm, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    run(spec, args, stream);
    return;
  }
  check_cublas(status, "cublasLtMatmul", __FILE__, __LINE__);
}

cublasStatus_t GemmRunner::matmul(const Plan& plan, const GemmArgs& args,
                                  const cublasLtMatmulAlgo_t& algorithm, cudaStream_t stream) {
  return cublasLtMatmul(handle_, plan.operation, &args.alpha, args.b, plan.layout_a, args.a, plan.layout_b,
                        &args.beta, args.d, plan.layout_d, args.d, plan.layout_d, &algorithm, workspace_,
                        workspace_bytes_, stream);
}

// Times the heuristic's candidates on this call's own operands (each writes only what the real call then
// overwrites: D, and the aux / bias-gradient outputs of the epilogue), so an accumulating GEMM (beta != 0)
// keeps the heuristic's first choice. The choice is process-wide per (device, spec, alignment), so every
// runner of a process runs a spec with the same algorithm (bitwise-identical results), and only a
// candidate at least kTuneMinGain faster replaces the first choice (a stable pick, not timing noise).
void GemmRunner::tune(Plan& plan, const GemmArgs& args, cudaStream_t stream) {
  plan.tuned = true;
  if (!tuning_ || plan.candidates.size() < 2 || args.beta != 0.0f) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MEGATUNE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  int device = 0;
  MEGATUNE_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, Key>, std::size_t> chosen;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto found = chosen.find({device, plan.key});
    if (found != chosen.end()) {
      if (found->second < plan.candidates.size()) plan.algorithm = plan.candidates[found->second];
      return;
    }
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&start));
  MEGATUNE_CUDA_CHECK(cudaEventCreate(&stop));
  auto launch = [&](const cublasLtMatmulAlgo_t& algorithm) { return matmul(plan, args, algorithm, stream); };
  // Each candidate's time is its best of kTuneRounds rounds that visit every candidate in turn, so that a
  // clock ramp or a neighbour's burst during one round does not decide the choice.
  std::vector<float> ms(plan.candidates.size(), -1.0f);
  std::vector<bool> usable(plan.candidates.size(), true);
  for (std::size_t i = 0; i < plan.candidates.size(); ++i)
    usable[i] = launch(plan.candidates[i]) == CUBLAS_STATUS_SUCCESS;  // warm-up; a refusal drops it
  for (int round = 0; round < kTuneRounds; ++round) {
    for (std::size_t i = 0; i < plan.candidates.size(); ++i) {
      if (!usable[i]) continue;
      MEGATUNE_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < kTuneRepeats && usable[i]; ++r)
        usable[i] = launch(plan.candidates[i]) == CUBLAS_STATUS_SUCCESS;
      MEGATUNE_CUDA_CHECK(cudaEventRecord(stop, stream));
      MEGATUNE_CUDA_CHECK(cudaEventSynchronize(stop));
      float elapsed = 0.0f;
      MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
      if (usable[i] && (ms[i] <= 0.0f || elapsed < ms[i])) ms[i] = elapsed;
    }
  }
  for (std::size_t i = 0; i < ms.size(); ++i)
    if (!usable[i]) ms[i] = -1.0f;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::size_t choice = 0;
  for (std::size_t i = 1; i < ms.size(); ++i) {
    if (ms[i] > 0.0f && (ms[choice] <= 0.0f || ms[i] < ms[choice])) choice = i;
  }
  if (ms[0] > 0.0f && !(ms[choice] < (1.0f - kTuneMinGain) * ms[0])) choice = 0;
  plan.algorithm = plan.candidates[choice];
  std::lock_guard<std::mutex> lock(mutex);
  chosen.emplace(std::make_pair(device, plan.key), choice);
}

void linear_forward(GemmRunner& runner, const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                    int64_t n, int64_t k, cudaStream_t stream) {
  GemmSpec spec = GemmSpec::linear_forward(m, n, k);
  if (bias != nullptr) spec.epilogue = GemmEpilogue::kBias;
  GemmArgs args;
  args.a = x, args.b = w, args.d = y, args.bias = bias;
  runner.run(spec, args, stream);
}

void linear_forward_gelu(GemmRunner& runner, const bf16* x, const bf16* w, const bf16* bias, bf16* pre_gelu,
                         bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  GemmSpec spec = GemmSpec::linear_forward(m, n, k);
  spec.epilogue = bias != nullptr ? GemmEpilogue::kGeluAuxBias : GemmEpilogue::kGeluAux;
  GemmArgs args;
  args.a = x, args.b = w, args.d = y, args.bias = bias, args.aux = pre_gelu;
  runner.run(spec, args, stream);
}

void linear_backward_data(GemmRunner& runner, const bf16* dy, const bf16* w, bf16* dx, int64_t m, int64_t n,
                          int64_t k, cudaStream_t stream, bool accumulate) {
  GemmSpec spec = GemmSpec::linear_backward_data(m, n, k);
  GemmArgs args;
  args.a = dy, args.b = w, args.d = dx, args.beta = accumulate ? 1.0f : 0.0f;
  runner.run(spec, args, stream);
}

void linear_backward_data_dgelu(GemmRunner& runner, const bf16* dy, const bf16* w, const bf16* pre_gelu,
                                bf16* dx_pre, bf16* dbias, int64_t m, int64_t n, int64_t k,
                                cudaStream_t stream) {
  GemmSpec spec = GemmSpec::linear_backward_data(m, n, k);
  spec.epilogue = GemmEpilogue::kDGeluBGrad;
  GemmArgs args;
  args.a = dy, args.b = w, args.d = dx_pre, args.aux = const_cast<bf16*>(pre_gelu), args.bias_grad = dbias;
  if (dbias == nullptr)
    throw std::invalid_argument("linear_backward_data_dgelu: dbias is required (cuBLASLt's DGELU_BGRAD)");
  runner.run(spec, args, stream);
}

void linear_backward_weight(GemmRunner& runner, const bf16* dy, const bf16* x, float* main_grad, int64_t m,
                            int64_t n, int64_t k, bool accumulate, cudaStream_t stream) {
  GemmSpec spec = GemmSpec::linear_backward_weight(m, n, k, GemmDType::kFP32);
  GemmArgs args;
  args.a = dy, args.b = x, args.d = main_grad, args.beta = accumulate ? 1.0f : 0.0f;
  runner.run(spec, args, stream);
}

}  // namespace megatune::executor::cuda
