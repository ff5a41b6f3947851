// FP8 training settings (Megatron-LM's --fp8-format, --fp8-recipe, --fp8-margin, --fp8-amax-history-len,
// --fp8-amax-compute-algo, as Transformer Engine runs them) and the facts the step program and the executor
// share about an FP8 linear layer: which casts it issues and the bytes each moves.
//
// An FP8 linear (the dense attention's QKV and output projection, the dense MLP's fc1 and fc2) casts its
// input and weight to FP8 before the forward GEMM, its output gradient before the data-gradient GEMM, and
// its input again (transposed) before the weight-gradient GEMM; Hopper's FP8 tensor cores take both
// operands with the reduction dimension contiguous, so the weight and the output gradient are cast into a
// transposed copy as well. The weight is cast once per iteration (Transformer Engine's first-micro-batch
// weight cache), at the first forward of micro-batch 0. The LM head, the embedding, norms, attention, the
// MoE router and the experts stay bf16.
#pragma once
#include <cstdint>
#include <string>

namespace megatune::layouts {

struct RankShape;

// kE4M3: every tensor in E4M3; kHybrid: E4M3 forward (inputs, weights), E5M2 for gradients.
enum class Fp8Format : std::uint8_t { kNone, kE4M3, kHybrid };
// kDelayed: each tensor's scale from the amax history of its earlier uses (Megatron's default recipe);
// kTensorwise: from the tensor's own amax, computed just before the cast (current scaling).
enum class Fp8Recipe : std::uint8_t { kDelayed, kTensorwise };
// The element encodings; their largest finite values are 448 and 57344.
enum class Fp8Encoding : std::uint8_t { kE4M3, kE5M2 };

struct Fp8Settings {
  Fp8Format format = Fp8Format::kNone;
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int margin = 0;            // --fp8-margin: scale = fp8_max / amax / 2^margin
  int amax_history_len = 1;  // --fp8-amax-history-len (Megatron's default 1)
  bool amax_max = false;     // --fp8-amax-compute-algo max (true) or most_recent (Megatron's default)
  bool enabled() const { return format != Fp8Format::kNone; }
  Fp8Encoding forward_encoding() const { return Fp8Encoding::kE4M3; }
  Fp8Encoding gradient_encoding() const {
    return format == Fp8Format::kHybrid ? Fp8Encoding::kE5M2 : Fp8Encoding::kE4M3;
  }
};

double fp8_max(Fp8Encoding encoding);  // 448 or 57344
// The value nearest x in the encoding (round to nearest even; beyond the largest finite value: that value
// with x's sign, as the saturating conversion of CUDA's cuda_fp8.h; NaN stays NaN).
float round_to_fp8(float x, Fp8Encoding encoding);
// The scale a tensor with this amax is multiplied by before the cast: fp8_max / amax / 2^margin; 1 when
// amax is 0 or not finite.
float fp8_scale_for_amax(float amax, Fp8Encoding encoding, int margin);

// Bytes of one cast of `elements` bf16 values into `outputs` FP8 copies (1: as stored, 2: also transposed);
// current scaling reads the input twice (the amax pass, then the cast).
std::int64_t fp8_cast_bytes(std::int64_t elements, int outputs, bool current_scaling);

// Fields of an FP8 tensor's scaling state, an fp32 vector on the device: the inverse of the scale (the
// GEMM's dequantization factor, first: cuBLASLt takes it by a pointer that must be 16-byte aligned), the
// scale the cast multiplies by, the amax of the last use not yet folded into the history and whether there
// is one, then the amax history (delayed scaling) of amax_history_len entries.
enum Fp8StateField : int {
  kFp8ScaleInv = 0,
  kFp8Scale = 1,
  kFp8PendingAmax = 2,
  kFp8Pending = 3,
  kFp8History = 4
};
// Elements of one state: its fields, padded to a multiple of 16 (64 bytes), so that states laid out one
// after another keep their scale pointers aligned.
std::int64_t fp8_state_elements(const Fp8Settings& settings);

// Hopper's FP8 GEMMs (cuBLASLt) take only dimensions that are multiples of 16: the tokens per rank and the
// per-rank features of the dense linears (qkv, proj, fc1, fc2; MLA's projections stay bf16). The first
// dimension that is not, as "<what> is <size>", or "" when every one is.
std::string fp8_shape_problem(const RankShape& shape);

// "fp8 hybrid delayed (amax history 1024, max, margin 0)", "fp8 e4m3 tensorwise (margin 0)", "bf16".
std::string describe(const Fp8Settings& settings);
const char* fp8_format_name(Fp8Format format);  // "e4m3", "hybrid", "none"
const char* fp8_recipe_name(Fp8Recipe recipe);  // "delayed", "tensorwise"

}  // namespace megatune::layouts
