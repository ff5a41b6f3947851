// PipelineLayout: Megatron's --pipeline-model-parallel-layout (parse, validate, expand, print) and the
// layouts Megatron derives without one (uniform, uneven first/last stage, embedding/loss accounting).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::layouts {

// One symbol of the layout grammar.
enum class LayerSymbol : char { kEmbedding = 'E', kDecoder = 't', kMtp = 'm', kLoss = 'L' };

// One pipeline stage (a model chunk on one pp rank). Stages are numbered in Megatron's global order:
// stage_index = vpp_rank * pp + pp_rank.
struct PipelineStage {
  int stage_index = 0;
  int pp_rank = 0;
  int vpp_rank = 0;                  // model chunk on that pp rank
  std::vector<LayerSymbol> symbols;  // in order, as written in the layout
  int first_decoder_layer = 0;       // global index of its first `t` (= number of `t` in earlier stages)
  int num_decoder_layers = 0;        // number of `t`
  int first_mtp_layer = 0;           // index among MTP layers of its first `m`
  int num_mtp_layers = 0;            // number of `m`
  bool has_embedding = false;        // holds `E`
  bool has_loss = false;             // holds `L` (final norm + output layer + loss)
  bool empty() const { return symbols.empty(); }
  std::string to_string() const;  // e.g. "Ettt", "" for an empty stage
};

class PipelineLayout {
 public:
  // Expansion of `(group)*n` and `x*n` is refused beyond this many characters (a clear UserError, no OOM or
  // long parse): a layout of 100000 symbols is far past any model's layer and stage counts.
  static constexpr int64_t kMaxExpandedLength = 100'000;

  PipelineLayout() = default;

  // Parses with Megatron's exact semantics: commas removed; one pass of `(group)*n` (no nesting), then one
  // pass of `x*n`; split on `|` (empty stages allowed); stage i -> pp rank i % pp, vpp rank i / pp.
  // Checks characters and `#stages % pp == 0`. Does NOT check the layer counts (see validate).
  // Errors: UserError naming --pipeline-model-parallel-layout, the position and the fix.
  static PipelineLayout parse(std::string_view text, int pipeline_model_parallel_size);

  // Builds a layout from stages listed in global order (vpp-major). #stages must be a multiple of pp.
  static PipelineLayout from_stages(std::vector<std::vector<LayerSymbol>> stages_in_global_order,
                                    int pipeline_model_parallel_size);

  // Megatron's even split (no layout string): each of the pp*vpp stages gets num_layers/(pp*vpp) layers;
  // E in the first stage, MTP layers and L in the last stage. Throws UserError when it does not divide.
  static PipelineLayout uniform(int num_layers, int pipeline_model_parallel_size,
                                int virtual_stages_per_rank = 1, int mtp_num_layers = 0);

  // Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (-1: not given):
  // the first (last) pp rank holds that many layers, the rest split evenly over the middle ranks; with
  // vpp each rank's layers split evenly over its chunks.
  static PipelineLayout uneven(int num_layers, int pipeline_model_parallel_size, int first_stage_layers,
                               int last_stage_layers, int virtual_stages_per_rank = 1,
                               int mtp_num_layers = 0);

  // Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: E (L)
  // counts as one layer in the even split, so the first (last) stage builds one decoder layer fewer.
  static PipelineLayout accounting_for_embedding_and_loss(int num_layers, int pipeline_model_parallel_size,
                                                          bool account_for_embedding, bool account_for_loss,
                                                          int virtual_stages_per_rank = 1,
                                                          int mtp_num_layers = 0);

  // Megatron's validate_layer_layout: first symbol E, last L, exactly one E and one L, #t == num_layers,
  // #m == mtp_num_layers, no t after the first m, all m in one stage, m only in the last chunk of a rank,
  // never on pp rank 0 (Megatron's docs). Stricter than Megatron's check, as its schedules need it: E sits in
  // the first stage and L in the last one (empty stages before E or after L are refused).
  // Throws UserError naming --pipeline-model-parallel-layout and the fix.
  void validate(int num_layers, int mtp_num_layers) const;

  int pp() const { return pp_; }
  int vpp() const { return pp_ > 0 ? static_cast<int>(stages_.size()) / pp_ : 0; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  const std::vector<PipelineStage>& stages() const { return stages_; }  // global order
  const PipelineStage& stage(int pp_rank, int vpp_rank) const;
  std::vector<const PipelineStage*> stages_of_rank(int pp_rank) const;  // by vpp rank
  int num_decoder_layers() const;
  int num_mtp_layers() const;
  // True when the MTP layers sit in the last chunk of a pp rank other than the last (Megatron's
  // mtp_standalone).
  bool mtp_standalone() const;

  // Canonical compressed form that parses back to the same stages, e.g. "Et*3|(tt|)*29m|L".
  std::string to_string() const;
  // Fully expanded form, e.g. "Ettt|tt|...|m|L".
  std::string expanded_string() const;

  friend bool operator==(const PipelineLayout& a, const PipelineLayout& b);

 private:
  int pp_ = 0;
  std::vector<PipelineStage> stages_;
};

// Expands Megatron's repetition syntax exactly as its two regex passes do (commas removed first) and
// returns the flat string with `|` separators. Throws UserError when the result would exceed
// PipelineLayout::kMaxExpandedLength. Exposed for tests and the fuzzer.
std::string expand_layout_repetitions(std::string_view text);

}  // namespace megatune::layouts
