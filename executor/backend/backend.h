// Backend: device memory (one arena sized up front), streams/events, the kernel set, and op recording.
// Model and training code are written once against this interface; the CPU and CUDA backends implement it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/backend/op_recorder.h"
#include "executor/backend/tensor.h"
#include "executor/kernels/adamw_hyper.h"
#include "executor/kernels/attention_merge.h"
#include "executor/kernels/attention_shape.h"
#include "executor/kernels/norm_kind.h"
#include "executor/kernels/rope_scaling.h"
#include "layouts/fp8.h"

namespace megatune::executor {

enum class ActivationKind {
  kGelu,
  kSwiglu
};  // GELU tanh approximation; SwiGLU = silu(a) * b, [a | b] halves

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) [+ bias (n)] [+ C if accumulate].
// A is stored (m, k), or (k, m) when transpose_a; B is stored (k, n), or (n, k) when transpose_b.
// C may be fp32 (weight gradients accumulated into the fp32 grad buffer) or the compute dtype.
// bias_grad (weight-gradient GEMMs dW = dY^T . X, transpose_a): the layer's bias gradient, fp32 (1, m) +=
// row sums of op(A) = column sums of dY, fused into the GEMM's epilogue where the backend can.
struct GemmArgs {
  Tensor a;
  bool transpose_a = false;
  Tensor b;
  bool transpose_b = false;
  Tensor c;
  Tensor bias;       // optional (1, n), forward epilogue
  Tensor bias_grad;  // optional (1, m) fp32, accumulated; requires transpose_a
  std::int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;
  // FP8 operands (a and b both DType::kFP8, layouts/fp8.h): stored with the reduction dimension contiguous
  // (transpose_a false, transpose_b true, as Hopper's FP8 tensor cores take them), in these encodings, each
  // multiplied by its fp32 (1, 1) dequantization factor on the device. fast_accumulate: the forward GEMM's
  // accumulation without the periodic fp32 promotion (Transformer Engine's fprop setting).
  layouts::Fp8Encoding a_encoding = layouts::Fp8Encoding::kE4M3, b_encoding = layouts::Fp8Encoding::kE4M3;
  Tensor a_scale_inv, b_scale_inv;
  bool fast_accumulate = false;
  bool is_fp8() const { return a.dtype == DType::kFP8; }
};

// One cast of src (rows, cols, the compute dtype) into FP8 (layouts/fp8.h): out (rows, cols) and / or
// out_transposed (cols, rows), DType::kFP8 in `encoding`, each value src * scale rounded to nearest even
// and saturated. state (fp32 (1, layouts::fp8_state_elements)) holds the scale: current scaling sets it from
// src's amax first; delayed scaling first folds a pending amax into the history (rolled by one, the
// scale from its maximum, or its newest entry, and the margin) and records this cast's amax as pending.
// bias_grad (optional, fp32 (1, cols)) += the column sums of src (a linear's bias gradient from its output
// gradient, read in the same pass).
struct Fp8CastArgs {
  Tensor src, out, out_transposed;
  layouts::Fp8Encoding encoding = layouts::Fp8Encoding::kE4M3;
  Tensor state;
  bool current_scaling = true;
  int margin = 0;
  int history_len = 1;
  bool amax_max = false;
  Tensor bias_grad;
};

// Bytes one arena allocation label holds (labels in first-allocation order); see Backend::arena_breakdown.
struct ArenaUse {
  std::string what;
  std::int64_t bytes = 0;
  int allocations = 0;
};

// One attention call (layout and semantics: executor/kernels/attention_shape.h): queries of one block
// against the keys / values of another, each tensor a view with its own token stride (row_stride).
// Self-attention over a packed QKV activation is self_attention_args().
struct AttentionArgs {
  Tensor q;    // (batch * seq_q, heads * head_dim)
  Tensor k;    // (batch * seq_kv, kv_heads * head_dim)
  Tensor v;    // (batch * seq_kv, kv_heads * head_dim_v)
  Tensor out;  // (batch * seq_q, heads * head_dim_v)
  Tensor lse;  // (batch * heads, seq_q) fp32 log-sum-exp of the scaled scores (natural log)
  std::int64_t batch = 0, seq_q = 0, seq_kv = 0, heads = 0, kv_heads = 0, head_dim = 0, head_dim_v = 0;
  bool causal = true;
  std::int64_t causal_offset = 0;  // query i attends keys j <= i + causal_offset
  float softmax_scale = 0.0f;      // 0: 1 / sqrt(head_dim)
};

// Global positions of the tokens of one local sequence, as runs of consecutive positions (context
// parallelism's load-balanced split holds two chunks of the sequence). Empty: positions 0 .. seq - 1.
struct PositionRun {
  std::int64_t local_begin = 0, length = 0, global_begin = 0;
};
using SequencePositions = std::vector<PositionRun>;

// The backward's tensors. d_out is laid out as out (same row stride). dq, dk, dv have the shapes of q, k, v
// (their own row strides) and are overwritten: with out and lse merged over several key blocks (context
// parallelism), each block's call yields that block's share, and the caller sums the shares.
struct AttentionGrads {
  Tensor d_out;  // (batch * seq_q, heads * head_dim_v)
  Tensor dq;     // (batch * seq_q, heads * head_dim)
  Tensor dk;     // (batch * seq_kv, kv_heads * head_dim)
  Tensor dv;     // (batch * seq_kv, kv_heads * head_dim_v)
};

// Causal self-attention on a packed qkv activation [b * s, q (heads * d) | k (kv_heads * d) | v (kv_heads *
// d)]: q, k, v are column views of qkv (storage_bytes: the backend's bytes per element of qkv's dtype).
AttentionArgs self_attention_args(Tensor qkv, Tensor out, Tensor lse, std::int64_t batch, std::int64_t seq,
                                  std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                  std::int64_t storage_bytes);
// dq, dk, dv as column views of a packed d_qkv laid out as the qkv of self_attention_args.
AttentionGrads packed_attention_grads(Tensor d_out, Tensor d_qkv, const AttentionArgs& args,
                                      std::int64_t storage_bytes);

// The kernels' view of a call: sizes and every tensor's token stride (both backends launch through it).
AttentionShape attention_shape(const AttentionArgs& args);
AttentionShape attention_shape(const AttentionArgs& args, const AttentionGrads& grads);

// y = norm(x [+ residual]) * gamma [+ beta]; with a residual, sum_out receives x + residual (the norm's
// input, which the backward reads).
struct NormArgs {
  NormKind kind = NormKind::kLayerNorm;
  float eps = 1e-5f;
  Tensor x;         // (T, h)
  Tensor residual;  // (T, h) optional
  Tensor sum_out;   // (T, h) when residual is given
  Tensor gamma;     // (1, h)
  Tensor beta;      // (1, h), empty for RMSNorm
  Tensor out;       // (T, h)
  Tensor mean;      // (T, 1) fp32 (LayerNorm only)
  Tensor rstd;      // (T, 1) fp32
  // A recompute: mean / rstd already hold x's statistics (written by the forward), so a backend may apply
  // them instead of reducing again; out must come out as the forward's (no residual with this).
  bool stats_given = false;
};

// Log-sum-exp merge of a key block's partial attention output into the running one (context parallelism's
// ring; layouts in executor/kernels/attention_merge.h).
struct AttentionMergeArgs {
  AttentionMergeShape shape;
  Tensor out;        // (batch * seq, heads * head_dim) running output, updated
  Tensor lse;        // (batch * heads, seq) fp32, updated
  Tensor block_out;  // (batch * queries, heads * head_dim)
  Tensor block_lse;  // (batch * heads, queries) fp32
};

// Where an MoE layer's token copies go (host side: routing runs on the host, as Megatron brings the token
// counts to the host): the expert-sorted rows r = 0..R-1 each copy token row_token[r]; token t's j-th
// choice is row token_rows[t * topk + j] (-1: dropped) weighted by token_probs[t * topk + j].
struct MoePermutation {
  std::int64_t tokens = 0;
  int topk = 0;
  std::vector<std::int32_t> row_token;   // (R)
  std::vector<std::int32_t> token_rows;  // (T, k)
  std::vector<float> token_probs;        // (T, k)
  // Runs [first, first + n) of rows no choice points to: copies that fill an expert to its capacity
  // (--moe-pad-expert-input-to-capacity); the combine leaves them out and its backward gives them zeros.
  std::vector<std::pair<std::int64_t, std::int64_t>> pad_runs;
  std::int64_t rows() const { return static_cast<std::int64_t>(row_token.size()); }
};

// One parameter tensor as the multi-tensor optimizer sees it (views into the flat buffers).
struct OptimizerTensor {
  Tensor main_param;   // fp32 (1, numel)
  Tensor main_grad;    // fp32 (1, numel)
  Tensor exp_avg;      // fp32 (1, numel)
  Tensor exp_avg_sq;   // fp32 (1, numel)
  Tensor model_param;  // compute dtype (1, numel): receives the updated weights
  bool apply_weight_decay = true;
  bool decoupled_lr = false;  // updated at AdamWHyper::decoupled_lr (the word embeddings, the output layer)
  // grad_norm() sums the squares of these only: false for a gradient another rank counts (a parameter
  // replicated over TP on tp rank > 0, a shared copy), so that a norm combined over ranks counts each once.
  bool in_grad_norm = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory: one arena reserved up front and bump-allocated; nothing is freed or allocated per step.
  // Setup code runs twice: first in sizing mode (allocate() returns tensors without data and only counts),
  // then for real after reserve_arena(sized_bytes()).
  virtual std::int64_t storage_bytes(DType dtype) const = 0;  // bytes of one element in this backend
  void begin_sizing();
  std::int64_t end_sizing();  // bytes the allocations made since begin_sizing() need
  bool sizing() const { return sizing_; }
  void reserve_arena(std::int64_t bytes);
  // Throws std::runtime_error naming `what` when the arena is exhausted.
  Tensor allocate(DType dtype, std::int64_t rows, std::int64_t cols, const char* what);
  Tensor allocate_int32(std::int64_t rows, std::int64_t cols, const char* what);
  std::int64_t arena_used_bytes() const { return arena_used_; }
  // Where the arena's bytes go: the allocations since the last begin_sizing() / reserve_arena(), summed
  // per `what` label (as aligned in the arena).
  const std::vector<ArenaUse>& arena_breakdown() const { return breakdown_; }
  std::int64_t arena_capacity_bytes() const { return arena_capacity_; }
  // Blocks outside the arena, for buffers sized by what a step needs (the MoE layers' routed rows, which
  // grow when a step routes more than any before): in sizing mode allocate_block() only counts; either way
  // its bytes enter the breakdown under `what` (not the arena's sized bytes), and release_block() takes
  // them out again and frees the block (the device idle first). The backend frees what is left when it
  // ends. block_bytes(): what the blocks hold now.
  Tensor allocate_block(DType dtype, std::int64_t rows, std::int64_t cols, const char* what);
  void release_block(Tensor block, const char* what);
  std::int64_t block_bytes() const { return block_bytes_; }
  static constexpr std::int64_t kArenaAlignBytes = 256;

  // ---- streams and events (overlap of compute and communication). The compute stream runs every kernel;
  // each process group's collectives run on that group's communication stream (layouts::stream_groups: a
  // stream per communicator), which a backend creates on first use. Work on different streams is ordered
  // only by events: record_event(s) marks the work issued on s so far, wait_event(t, e) holds the work
  // issued on t afterwards until it is done.
  struct Stream {
    layouts::CommGroup group = layouts::CommGroup::kNone;  // kNone: the compute stream
    static Stream compute() { return {}; }
    static Stream communication(layouts::CommGroup group) { return {group}; }
    bool is_compute() const { return group == layouts::CommGroup::kNone; }
    bool operator==(const Stream&) const = default;
  };
  using Event = int;
  virtual Event record_event(Stream stream) = 0;
  virtual void wait_event(Stream waiting, Event event) = 0;
  // Host wait for the work issued so far on every stream.
  virtual void synchronize() = 0;

  // Host <-> backend copies (convert from/to float). Synchronous: the copy runs on `stream` (a staged
  // collective's on its group's stream) after the work issued there so far, and is done on return.
  void upload(Tensor dst, const float* host, Stream stream = Stream::compute()) {
    do_upload(dst, host, stream);
  }
  void download(Tensor src, float* host, Stream stream = Stream::compute()) {
    do_download(src, host, stream);
  }
  virtual void upload_int32(Tensor dst, const std::int32_t* host) = 0;
  virtual void fill_zero(Tensor t) = 0;
  virtual void copy(Tensor src, Tensor dst) = 0;  // same shape; converts dtype

  // ---- scratch: one workspace shared by the kernels that need one (they run in order on the compute
  // stream). The model states its largest shapes; the backend answers the bytes; the model allocates them
  // from the arena and hands them over with set_scratch().
  struct ScratchNeeds {
    std::int64_t tokens = 0;  // rows of the activations
    std::int64_t hidden = 0;  // norm width
    // --qk-layernorm's head norms: rows (T * heads / tp) and width (head_dim); 0: none.
    std::int64_t head_norm_rows = 0, head_norm_width = 0;
    std::int64_t max_bias_cols = 0;  // widest bias-gradient column sum
    std::int64_t vocab = 0;          // embedding rows
    AttentionArgs attention;         // shape of the attention calls
  };
  virtual std::int64_t scratch_bytes(const ScratchNeeds& needs) const {
    (void)needs;
    return 0;
  }
  void set_scratch(Tensor scratch) { scratch_ = scratch; }

  // ---- kernels. Each records one Op (kind + shape) when recording is on, then runs.
  void gemm(const GemmArgs& args, const OpTag& tag);
  // GEMMs over consecutive row groups (an MoE layer's local experts), recorded as one grouped op: forward
  // and data-gradient GEMMs (no transpose_a) share n and k and the op's m is the sum of their m; weight
  // gradients (transpose_a) share m and n and the op's k is the sum of their k. Every GEMM has the same
  // accumulate flag. Default: one backend GEMM each.
  void grouped_gemm(const std::vector<GemmArgs>& gemms, const OpTag& tag);
  void bias_grad(Tensor d_out, Tensor d_bias, const OpTag& tag);  // d_bias (1, n) fp32 += column sums
  // Token t of each sequence of `seq` adds position_table row positions(t) (one op, the runs one call each).
  void embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq, Tensor out,
                         const OpTag& tag, const SequencePositions& positions = {});
  // d_table (V, h) fp32 += scatter of d_out rows; d_position_table (S, h) likewise when given.
  void embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                          Tensor d_position_table, const OpTag& tag, const SequencePositions& positions = {});
  void norm_forward(const NormArgs& args, const OpTag& tag);
  // d_x (T, h) = norm'(d_out) [+ d_residual]; reads the norm input (args.sum_out when a residual was fused,
  // else args.x); d_gamma / d_beta (fp32 grads) accumulate.
  void norm_backward(const NormArgs& args, Tensor d_out, Tensor d_residual, Tensor d_x, Tensor d_gamma,
                     Tensor d_beta, const OpTag& tag);
  // Rotary embedding (rotate-half convention, positions s = row % seq, or `positions` of s) on the q and k
  // parts of qkv, in place; inverse = true applies the transpose rotation (the backward). scaling: YaRN's
  // frequencies and cos/sin factor (rope_scaling.h); the default is plain RoPE.
  void rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
            float theta, bool inverse, const OpTag& tag, const SequencePositions& positions = {},
            const RopeScaling& scaling = {});
  void attention_forward(const AttentionArgs& args, const OpTag& tag);
  // grads.dq, dk, dv (overwritten) from grads.d_out; uses args.out and args.lse from the forward (or merged).
  void attention_backward(const AttentionArgs& args, const AttentionGrads& grads, const OpTag& tag);
  // Empty when this backend's kernels run the attention shape; else why not, in words for a user (the
  // model asks when it is configured, before it allocates). The reference kernels take every shape.
  virtual std::string attention_unsupported(const AttentionShape& shape) const {
    (void)shape;
    return {};
  }
  // Empty when this backend's norm kernels take rows of `width` features; else why not, for a user. The
  // reference kernels take every width.
  virtual std::string norm_unsupported(std::int64_t width) const {
    (void)width;
    return {};
  }
  // Linear layer with a fused GELU (cuBLASLt GELU_AUX_BIAS where it can): args.c = pre (T, n) =
  // x . w^T [+ bias], kept for the backward; out (T, n) = gelu(pre). Records one GEMM op (args' shape).
  void linear_gelu_forward(const GemmArgs& args, Tensor out, const OpTag& tag);
  void activation_forward(ActivationKind kind, Tensor in, Tensor out, const OpTag& tag);
  // d_in (shape of in) from d_out; element-wise, so d_in may alias in (or, for GELU, d_out).
  void activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in, const OpTag& tag);
  // The backward that also recomputes the activation output (not saved; the next layer's weight gradient
  // reads it), in one pass: d_in (shape of in) from d_out, and out = act(in) (shape of d_out). Element-wise:
  // d_in may alias in and out may alias d_out.
  void activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in, Tensor out,
                                     const OpTag& tag);
  // Fused cross-entropy over logits (T, V) with int32 targets (T, 1) (negative = masked): losses (T, 1)
  // fp32, and the logits are overwritten by grad_scale * (softmax - onehot). No second copy of the logits.
  void cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale, const OpTag& tag);
  // Vocab-parallel cross entropy (Megatron's): logits (T, V / tp) are this rank's vocabulary slice starting
  // at global id vocab_offset; targets (T, 1) hold global ids (negative = masked); losses and the in-place
  // gradient as cross_entropy(). Between its passes it calls reduce(stats, is_max, label) to reduce a (T, 1)
  // fp32 tensor over the tensor-parallel group: the row maxima ("ce_max_ar", max), then the target logits
  // ("ce_target_ar", sum) and the sums of exp ("ce_sum_exp_ar", sum). Recorded as one kCrossEntropy op (the
  // first pass is what op timing brackets) followed by whatever the reductions record.
  struct CrossEntropyStats {
    Tensor row_max, target_logit, sum_exp;  // (T, 1) fp32 each
  };
  using StatsReduce = std::function<void(Tensor stats, bool is_max, const char* label)>;
  void vocab_parallel_cross_entropy(Tensor logits, Tensor targets, std::int64_t vocab_offset, Tensor losses,
                                    float grad_scale, const CrossEntropyStats& stats,
                                    const StatsReduce& reduce, const OpTag& tag);
  // MoE permutation: out (R, h) = the rows of x (T, h) in the expert-sorted order of `plan`.
  void moe_permute(Tensor x, const MoePermutation& plan, Tensor out, const OpTag& tag);
  // out (T, h) = for each token the sum over its choices of rows (R, h), weighted by the plan's
  // probabilities when `weighted` (the combine), else 1 (the permutation's backward).
  void moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out, const OpTag& tag);
  // Backward of the weighted combine: d_rows (R, h) and, on the host, d_probs (T * k) = the gradient of
  // each choice's probability.
  void moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan, Tensor d_rows,
                              std::vector<float>& d_probs, const OpTag& tag);
  void add(Tensor a, Tensor b, Tensor out, const OpTag& tag);  // out = a + b (out may alias a)
  // For each of the sequences of dst (rows seq each; dst and src contiguous): its rows [first, first + n)
  // += src's n rows of that sequence, n = src.rows / sequences. One op.
  void add_rows(Tensor dst, Tensor src, std::int64_t seq, std::int64_t first, const OpTag& tag);
  void attention_merge(const AttentionMergeArgs& args, const OpTag& tag);
  void cast(Tensor src, Tensor dst, const OpTag& tag);  // e.g. fp32 main params -> model dtype
  // One op (kElementwise, layouts::fp8_cast_bytes) of dtype kFP8, what it writes (as the step program has
  // it).
  void fp8_cast(const Fp8CastArgs& args, const OpTag& tag);
  // t *= factor in place (gradients scaled to the mean over data-parallel ranks); fp32 on CUDA.
  void scale(Tensor t, float factor, const OpTag& tag);

  // ---- multi-tensor optimizer over a table registered once at setup.
  virtual void prepare_optimizer(std::vector<OptimizerTensor> tensors) = 0;
  // L2 norm of every registered main_grad flagged in_grad_norm (deterministic), returned to the host.
  float grad_norm(const OpTag& tag);
  // Replaces the norm the next adamw_step() clips by and skips on: a global norm combined over ranks from
  // their grad_norm()s (executor/parallel/grad_norm.h). Records nothing.
  void set_grad_norm(float norm) { do_set_grad_norm(norm); }
  // One AdamW step over every registered tensor, clipping by hyper.max_grad_norm against the last
  // grad_norm() (or set_grad_norm()); writes the updated model_param copies.
  void adamw_step(const AdamWHyper& hyper, const OpTag& tag);

  OpRecorder& recorder() { return recorder_; }
  // Brackets work issued outside the kernel set (the Communicator's collectives and transfers) so that it
  // is recorded, observed and timed like a kernel. microbatch / chunk >= -1 replace the recorder's schedule
  // position on the op (a batched p2p exchange carries other micro-batches' tensors); -2 keeps it.
  void begin_external_op(layouts::Op op, const OpTag& tag, int microbatch = -2, int chunk = -2);
  void end_external_op() { end_op(); }
  // Per-op timing: when on, every op is bracketed (CUDA: timing events on the compute stream; CPU: the host
  // clock) and timed_ops() returns each op issued since the last call (synchronizes) with its duration and
  // its start, in ms after the first of them began.
  void set_op_timing(bool on) { op_timing_ = on; }
  bool op_timing() const { return op_timing_; }
  struct TimedOp {
    layouts::Op op;
    double ms = 0.0;
    double start_ms = 0.0;
  };
  virtual std::vector<TimedOp> timed_ops() { return {}; }
  // Device memory in use on the whole device (CUDA: total - free), or -1 where there is none to ask.
  virtual std::int64_t device_memory_used_bytes() { return -1; }
  // The device's SM clock and power now (CUDA: NVML), -1 where unavailable.
  struct DeviceSample {
    double sm_clock_mhz = -1.0, power_w = -1.0;
  };
  virtual DeviceSample sample_device() { return {}; }

  // Per-op observation (e.g. the profiler's CUPTI op ranges): op_begin(i, op) is called before the kernels
  // of the i-th op issued since set_op_observer(), with the op stamped as the recorder stamps it, and
  // op_end() after them; calls are balanced and never nest. Independent of recording and op timing; no
  // cost when no observer is set. The observer must outlive its registration (pass nullptr to detach).
  struct OpObserver {
    virtual ~OpObserver() = default;
    virtual void op_begin(std::size_t op_index, const layouts::Op& op) = 0;
    virtual void op_end() = 0;
  };
  void set_op_observer(OpObserver* observer) {
    op_observer_ = observer;
    observed_ops_ = 0;
  }

 protected:
  // Timing hooks around each kernel (only called while set_op_timing(true)).
  virtual void on_op_begin(const layouts::Op& op) { (void)op; }
  virtual void on_op_end() {}
  // Reserves `bytes` of backend memory for the arena (called once); returns its base.
  virtual void* reserve_memory(std::int64_t bytes) = 0;
  virtual void do_upload(Tensor dst, const float* host, Stream stream) = 0;
  virtual void do_download(Tensor src, float* host, Stream stream) = 0;
  // A block of `bytes` outside the arena (allocate_block), and its release; the backend frees those still
  // held when it ends.
  virtual void* reserve_block(std::int64_t bytes) = 0;
  virtual void free_block(void* block) = 0;
  virtual void do_gemm(const GemmArgs& args) = 0;
  virtual void do_grouped_gemm(const std::vector<GemmArgs>& gemms) {
    for (const GemmArgs& g : gemms) do_gemm(g);
  }
  virtual void do_bias_grad(Tensor d_out, Tensor d_bias) = 0;
  virtual void do_embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq,
                                    Tensor out) = 0;
  virtual void do_embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                                     Tensor d_position_table) = 0;
  virtual void do_norm_forward(const NormArgs& args) = 0;
  virtual void do_norm_backward(const NormArgs& args, Tensor d_out, Tensor d_residual, Tensor d_x,
                                Tensor d_gamma, Tensor d_beta) = 0;
  // Positions position_offset + row % seq.
  virtual void do_rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, float theta, bool inverse, std::int64_t position_offset,
                       const RopeScaling& scaling) = 0;
  virtual void do_attention_forward(const AttentionArgs& args) = 0;
  virtual void do_attention_backward(const AttentionArgs& args, const AttentionGrads& grads) = 0;
  // Default: the unfused composition (GEMM, then the activation kernel).
  virtual void do_linear_gelu_forward(const GemmArgs& args, Tensor out);
  virtual void do_activation_forward(ActivationKind kind, Tensor in, Tensor out) = 0;
  virtual void do_activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in) = 0;
  virtual void do_activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                                Tensor out) = 0;
  virtual void do_cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale) = 0;
  // The three passes of vocab_parallel_cross_entropy (stats as documented there).
  virtual void do_cross_entropy_row_max(Tensor logits, Tensor row_max) = 0;
  virtual void do_cross_entropy_target_sum_exp(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                               const CrossEntropyStats& stats) = 0;
  virtual void do_cross_entropy_finish(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                       const CrossEntropyStats& stats, Tensor losses, float grad_scale) = 0;
  // The MoE permutation kernels. Default: the reference kernels over host copies (download, compute,
  // upload), correct on any backend; a backend overrides them with device kernels.
  virtual void do_moe_permute(Tensor x, const MoePermutation& plan, Tensor out);
  virtual void do_moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out);
  virtual void do_moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan, Tensor d_rows,
                                         std::vector<float>& d_probs);
  virtual void do_add(Tensor a, Tensor b, Tensor out) = 0;
  virtual void do_attention_merge(const AttentionMergeArgs& args) = 0;
  virtual void do_cast(Tensor src, Tensor dst) = 0;
  virtual void do_fp8_cast(const Fp8CastArgs& args) = 0;
  virtual void do_scale(Tensor t, float factor) = 0;
  virtual float do_grad_norm() = 0;
  virtual void do_set_grad_norm(float norm) = 0;
  virtual void do_adamw_step(const AdamWHyper& hyper) = 0;
  std::int64_t optimizer_elements_ = 0;  // set by prepare_optimizer implementations
  Tensor scratch_;                       // see set_scratch()

 private:
  void begin_op(layouts::Op op, const OpTag& tag, int microbatch = -2, int chunk = -2);
  void end_op();
  // Rows [first, first + rows) of t (null data stays null: sizing mode).
  Tensor row_slice(Tensor t, std::int64_t first, std::int64_t rows) const;
  bool op_timing_ = false;
  OpObserver* op_observer_ = nullptr;
  std::size_t observed_ops_ = 0;
  Tensor bump(std::int64_t bytes, std::int64_t rows, std::int64_t cols, const char* what);
  // Adds `bytes` (negative: removes) to the breakdown line `what`.
  void account(const char* what, std::int64_t bytes, int allocations);
  OpRecorder recorder_;
  char* arena_base_ = nullptr;
  std::int64_t arena_capacity_ = 0;
  std::int64_t arena_used_ = 0;
  bool sizing_ = false;
  std::int64_t sized_bytes_ = 0;
  std::int64_t block_bytes_ = 0;
  std::vector<ArenaUse> breakdown_;
};

}  // namespace megatune::executor
