// Op: the kernel level of the step program: one kernel or collective that a rank issues, with its shape.
// The planner prices Ops; the executor issues (and records) them; a test holds the two lists against each
// other.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megatune::layouts {

enum class OpKind : std::uint8_t {
  // Matrix work.
  kGemm,               // (m, k) x (k, n) -> (m, n); `accumulate` = beta 1 into an fp32 buffer (wgrad)
  kAttentionForward,   // flash attention forward over `attention`
  kAttentionBackward,  // flash attention backward (dq, dk, dv) over `attention`
  // Memory-bound kernels: priced by `bytes` (read + written).
  kEmbedding,
  kEmbeddingBackward,
  kNorm,  // LayerNorm / RMSNorm forward (optionally with fused residual add)
  kNormBackward,
  kRope,
  kRopeBackward,
  kActivation,  // GELU / SwiGLU forward
  kActivationBackward,
  kCrossEntropy,  // fused forward + in-place gradient over the logits
  kElementwise,   // residual adds, casts, scales, copies
  kRouter,        // MoE router (top-k + softmax) and token permutation
  kGradNorm,
  kOptimizer,  // multi-tensor AdamW
  // Communication: `bytes` follows nccl-tests' conventions (per-rank input for all-reduce, all-to-all,
  // send/recv and broadcast; total output for all-gather and reduce-scatter).
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv,
  kBroadcast,
};

enum class DType : std::uint8_t { kBF16, kFP16, kFP32, kFP8 };

// Which process group a collective runs over (megatron.md §6).
enum class CommGroup : std::uint8_t {
  kNone,
  kTensor,
  kContext,
  kData,
  kDataContext,  // gradient reduction of dense params
  kPipeline,
  kExpert,
  kExpertTensor,
  kExpertData,
  kTensorExpert,
  kEmbedding,  // tied word-embedding gradient between first and last pipeline stage
  kWorld,
};
inline constexpr int kCommGroupCount = static_cast<int>(CommGroup::kWorld) + 1;

// Where in the iteration an op belongs.
enum class OpPhase : std::uint8_t { kForward, kBackward, kRecompute, kGradSync, kOptimizer };

// Why an op is issued: what the simulator and the executor key on (labels name the op for people and
// traces; nothing string-matches them). Every kernel that is not communication is kCompute: its kind and
// phase already say which it is (kGradNorm and kOptimizer kernels run in OpPhase::kOptimizer).
enum class OpRole : std::uint8_t {
  kCompute,
  kTensorParallel,            // TP/SP collectives of the layers, the embedding and the vocab-parallel loss
  kContextParallelRing,       // CP ring step (cp_comm p2p): kSend/kRecv of K,V (+ dK,dV) over kContext
  kContextParallelGather,     // CP all_gather variant: the K,V all-gather and the dK,dV reduce-scatter
  kExpertDispatch,            // MoE token dispatch and combine (all-to-all over ep, gathers over etp, tp-ep)
  kP2pActivation,             // pipeline send/recv of an activation (towards the next stage)
  kP2pGradient,               // pipeline send/recv of an activation gradient (towards the previous stage)
  kGradReduce,                // a dense gradient bucket over dp-cp (all-reduce; reduce-scatter with dist-opt)
  kExpertGradReduce,          // an expert gradient bucket over expert-dp
  kEmbeddingGradReduce,       // tied word-embedding gradient between the first and the last stage
  kSequenceParallelNormGrad,  // all-reduce over tp of the gradients of the SP-replicated norms
  kGradNormReduce,            // all-reduce of the squared gradient norm
  kParamGather,               // distributed optimizer: all-gather of a dense bucket's bf16 params
  kExpertParamGather,         // distributed optimizer: all-gather of an expert bucket's bf16 params
  kFsdpParamGather,  // FSDP optim_grads_params: a dense bucket's params gathered before a segment reads them
  kFsdpExpertParamGather,  // the same of an expert bucket, over expert-dp
};

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t heads = 0;     // query heads on this rank
  std::int64_t kv_heads = 0;  // key/value heads (query groups) on this rank
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim = 0;    // of the queries and keys
  std::int64_t head_dim_v = 0;  // of the values and the output; 0: head_dim (MLA: 128 beside q/k's 192)
  bool causal = true;
  std::int64_t value_head_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool operator==(const AttentionShape& o) const {
    return batch == o.batch && heads == o.heads && kv_heads == o.kv_heads && seq_q == o.seq_q &&
           seq_kv == o.seq_kv && head_dim == o.head_dim && value_head_dim() == o.value_head_dim() &&
           causal == o.causal;
  }
};

struct Op {
  OpKind kind = OpKind::kGemm;
  OpPhase phase = OpPhase::kForward;
  OpRole role = OpRole::kCompute;
  DType dtype = DType::kBF16;
  std::string label;  // what it is in the model: "qkv", "proj", "fc1", "fc2", "logits", "attn", "norm1", ...
  // GEMM shape: (m, k) x (k, n).
  std::int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;
  AttentionShape attention;
  std::int64_t bytes = 0;  // memory-bound: bytes moved; collectives: see OpKind
  // Communication.
  CommGroup group = CommGroup::kNone;
  int group_size = 1;
  int peer_rank = -1;  // send/recv: the global rank on the other side
  // The stream it runs on: kNone the compute stream (every kernel), else the communication stream of that
  // process group (a collective's: stream_group() of its group).
  CommGroup stream = CommGroup::kNone;
  // Where it comes from.
  int layer = -1;  // global decoder-layer index; -1 for embedding, loss, optimizer, ...
  int microbatch = -1;
  int chunk = -1;  // model chunk (virtual pipeline stage) on this rank

  // Fields that identify the work (not the bookkeeping): what the executor and simulator must agree on.
  bool same_work(const Op& other) const;
  double gemm_flops() const { return kind == OpKind::kGemm ? 2.0 * m * n * k : 0.0; }
  double attention_flops() const;  // causal counted half; backward = 2.5x forward
  bool is_communication() const { return kind >= OpKind::kAllReduce; }
};

const char* op_kind_name(OpKind kind);
const char* comm_group_name(CommGroup group);
const char* op_phase_name(OpPhase phase);
const char* op_role_name(OpRole role);  // "compute", "tensor_parallel", "p2p_gradient", ...
std::int64_t dtype_bytes(DType dtype);
// One compact line, e.g. "F mb0 c0 L3 gemm fc1 m=8192 n=16384 k=4096 bf16".
std::string to_string(const Op& op);

}  // namespace megatune::layouts
