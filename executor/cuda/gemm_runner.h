// GemmRunner: cuBLASLt GEMMs through a row-major API, with fused epilogues (bias, GELU+aux, dGELU+bias
// grad, bias grad of B) and a per-(shape, layout, types, epilogue) cache of descriptors and the heuristic's
// algorithm, over one fixed workspace. The profiler times exactly this object's run().
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// kFP8E4M3 / kFP8E5M2: FP8 operands (Hopper takes them only as "TN": our A not transposed, our B
// transposed, both with the reduction dimension contiguous), each dequantized by a device scale.
enum class GemmDType { kBF16, kFP32, kFP8E4M3, kFP8E5M2 };
inline bool is_fp8(GemmDType t) { return t == GemmDType::kFP8E4M3 || t == GemmDType::kFP8E5M2; }

enum class GemmEpilogue {
  kNone,
  kBias,         // D = A.B + bias[n]                                           (bias: type of D)
  kGeluAux,      // aux = A.B, D = gelu_tanh(aux)                                  (aux: type of D)
  kGeluAuxBias,  // aux = A.B + bias[n], D = gelu_tanh(aux)                        (aux: type of D)
  kDGeluBGrad,   // D = (A.B) * gelu'(aux); bias_grad[n] = column sums of D       (bias_grad: type of D)
  kDGelu,        // D = (A.B) * gelu'(aux)
  kBGradA,       // D = A.B; bias_grad[m] = sum over k of op(A)[m, :]: the bias gradient of a weight-gradient
                 // GEMM dw = dy^T . x (cuBLASLt's BGRADB, B being cuBLAS's name for our A)  (type of D)
};

// Row-major description: D[m, n] = alpha * op(A)[m, k] . op(B)[k, n] + beta * C, C == D in memory.
// op(A) = A stored [m, k] with row stride lda, or (trans_a) A stored [k, m]; op(B) likewise ([k, n] or,
// trans_b, [n, k]). Leading dimensions 0 mean "packed" (the row length). batch_count > 1 runs a strided
// batch (strides in elements; 0 = packed matrix size).
struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0, ld_aux = 0;
  GemmDType ab_type = GemmDType::kBF16;  // A's type, and B's unless FP8
  GemmDType b_type = GemmDType::kBF16;   // B's type when ab_type is FP8 (FP8 A and B may differ)
  GemmDType d_type = GemmDType::kBF16;
  bool fast_accumulate = false;  // FP8: cuBLASLt's FAST_ACCUM (no periodic fp32 promotion)
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  int batch_count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;

  // Linear-layer shapes (x [m, k], w [n, k] as nn.Linear, dy [m, n]):
  static GemmSpec linear_forward(int64_t m, int64_t n, int64_t k);        // y = x . w^T        TN
  static GemmSpec linear_backward_data(int64_t m, int64_t n, int64_t k);  // dx = dy . w        NN
  static GemmSpec linear_backward_weight(int64_t m, int64_t n, int64_t k,
                                         GemmDType dw_type);  // dw = dy^T . x
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch_count); }
};

struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;  // also read as C when beta != 0
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* bias = nullptr;  // kBias / kGeluAuxBias: [n]
  void* aux = nullptr;         // kGeluAux(Bias) (written) / kDGelu(BGrad) (read): [m, n], row stride ld_aux
  void* bias_grad = nullptr;   // kDGeluBGrad: [n], kBGradA: [m]; overwritten
  // FP8 operands: device fp32 factors that A's and B's stored values are multiplied by.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

class GemmRunner {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;

  // Creates the cuBLASLt handle and allocates the workspace on the current device (setup time, once).
  explicit GemmRunner(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Runs one GEMM on stream. The first call for a (spec) builds and caches the descriptors and picks the
  // algorithm: cuBLASLt's heuristic offers up to kTuneCandidates, and unless the GEMM accumulates into its
  // output (beta != 0) they are timed on the call's own operands (best of kTuneRounds rounds of
  // kTuneRepeats runs, rounds interleaved over the candidates) and the fastest is kept when it
  // beats the heuristic's first choice by kTuneMinGain (H200, engine shapes: up to 8-11% faster GEMMs;
  // one choice per process, device and spec); later calls only launch. The plan is keyed by the spec and by
  // the pointer alignment (cuBLASLt picks kernels by it). Never allocates after the first call of a spec.
  // Throws std::runtime_error (with file:line) on any cuBLASLt error, and when cuBLASLt offers no algorithm
  // for the spec (e.g. a fused epilogue it does not support for these types): use the unfused path then.
  void run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);

  // Runs a GEMM whose token dimension changes from call to call (an MoE layer's per-expert row counts): the
  // rows of A's storage, i.e. m (or k when trans_a). The plan is the one of the spec with that size rounded
  // up to ragged_bucket(size), with the heuristic's first algorithm (not timed: see run_ragged), its matrix
  // layouts set to this call's sizes before the launch; so changing counts neither grow the cache per size
  // nor stall on tuning. No epilogue; a spec it
  // cannot bucket (trans_a with trans_b) or a size the bucket's algorithm refuses runs through run().
  void run_ragged(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);
  // The bucket of a ragged size: rounded up to max(128, 2^floor(log2 size) / 8), at most 12.5% above it.
  static int64_t ragged_bucket(int64_t size);
  // Builds the plan for spec without running (so a profiler or the engine can warm the cache up front).
  // alignment_bytes: the alignment the pointers of later run() calls will have (power of two <= 256).
  void prepare(const GemmSpec& spec, int alignment_bytes = 256);
  // Whether run(spec, args) can run: builds (and caches) the plan for the alignment of args' pointers and
  // returns false, remembering the answer, when cuBLASLt offers no algorithm or rejects the epilogue's
  // requirements (aux leading dimension a multiple of 8, bias / aux / bias-gradient pointers 16-byte
  // aligned). Callers fall back to the unfused kernels then.
  bool supports(const GemmSpec& spec, const GemmArgs& args);
  size_t cached_plans() const { return plans_.size(); }
  // Timing the heuristic's candidates on first use (default on); off: always its first choice.
  void set_tuning(bool on) { tuning_ = on; }
  static constexpr int kTuneCandidates = 8, kTuneRepeats = 3, kTuneRounds = 3;
  static constexpr float kTuneMinGain = 0.03f;
  size_t workspace_bytes() const { return workspace_bytes_; }
  cublasLtHandle_t handle() const { return handle_; }

  struct Plan;  // descriptors + algorithm (defined in gemm_runner.cpp)

 private:
  using Key = std::array<int64_t, 19>;
  static Key key_of(const GemmSpec& spec, int alignment_bytes, bool ragged = false);
  Plan& plan_for(const GemmSpec& spec, int alignment_bytes, bool ragged = false);
  void tune(Plan& plan, const GemmArgs& args, cudaStream_t stream);
  // One cublasLtMatmul of plan with args' pointers and scalars.
  cublasStatus_t matmul(const Plan& plan, const GemmArgs& args, const cublasLtMatmulAlgo_t& algorithm,
                        cudaStream_t stream);
  bool tuning_ = true;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, bool> unsupported_;  // specs the heuristic refused (value unused)
};

// Linear-layer helpers (row-major, bf16 activations/weights, x [m, k], w [n, k], y/dy [m, n]).
// y = x . w^T (+ bias [n]).
void linear_forward(GemmRunner& runner, const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                    int64_t n, int64_t k, cudaStream_t stream);
// pre_gelu [m, n] = x . w^T + bias; y = gelu_tanh(pre_gelu) (GELU_AUX_BIAS; bias may be null).
void linear_forward_gelu(GemmRunner& runner, const bf16* x, const bf16* w, const bf16* bias, bf16* pre_gelu,
                         bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
// dx [m, k] = dy . w; with beta_accumulate, dx += (bf16 accumulate).
void linear_backward_data(GemmRunner& runner, const bf16* dy, const bf16* w, bf16* dx, int64_t m, int64_t n,
                          int64_t k, cudaStream_t stream, bool accumulate = false);
// dx_pre [m, k] = (dy . w) * gelu'(pre_gelu [m, k]); dbias [k] = column sums of dx_pre (bf16, overwritten,
// may be null: then no bias gradient). The backward of linear_forward_gelu's activation fused into the
// next layer's data gradient.
void linear_backward_data_dgelu(GemmRunner& runner, const bf16* dy, const bf16* w, const bf16* pre_gelu,
                                bf16* dx_pre, bf16* dbias, int64_t m, int64_t n, int64_t k,
                                cudaStream_t stream);
// main_grad [n, k] fp32 (+)= dy^T . x (accumulate = Megatron's gradient_accumulation_fusion: beta = 1).
void linear_backward_weight(GemmRunner& runner, const bf16* dy, const bf16* x, float* main_grad, int64_t m,
                            int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

}  // namespace megatune::executor::cuda
