// PipelineLayout: Megatron's layout grammar (exact regex semantics, hand-written), validation, the
// derived uniform / uneven / embedding-and-loss layouts, and canonical printing.
#include "layouts/pipeline_layout.h"

#include <algorithm>
#include <array>
#include <string>

#include "base/user_error.h"

namespace megatune::layouts {

namespace {

constexpr const char* kFlag = "--pipeline-model-parallel-layout";

// The layout as quoted in messages, shortened so a message stays one readable line.
std::string quoted(std::string_view text) {
  std::string shown(text.substr(0, 80));
  for (char& ch : shown) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
  }
  if (text.size() > 80) shown += "...";
  return "'" + shown + "'";
}

[[noreturn]] void layout_error(std::string_view text, const std::string& problem, const std::string& fix) {
  throw UserError(std::string(kFlag) + " " + quoted(text) + ": " + problem + ": " + fix);
}

bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

// Reads \d+ at s[pos...]; returns the count (saturated above the expansion cap) and moves pos past it.
int64_t read_count(std::string_view s, size_t& pos) {
  int64_t value = 0;
  while (pos < s.size() && is_digit(s[pos])) {
    if (value <= PipelineLayout::kMaxExpandedLength) value = value * 10 + (s[pos] - '0');
    ++pos;
  }
  return value;
}

void append_repeated(std::string& out, std::string_view piece, int64_t count, std::string_view original) {
  const int64_t added =
      static_cast<int64_t>(piece.size()) * count;  // count <= ~1e7, size <= ~1e6+: no overflow
  if (count > PipelineLayout::kMaxExpandedLength ||
      static_cast<int64_t>(out.size()) + added > PipelineLayout::kMaxExpandedLength) {
    layout_error(
        original,
        "a repetition expands it beyond " + std::to_string(PipelineLayout::kMaxExpandedLength) + " symbols",
        "use repetition counts that match the model's layer count");
  }
  for (int64_t i = 0; i < count; ++i) out.append(piece);
}

std::string stage_rle(const std::vector<LayerSymbol>& symbols) {
  std::string out;
  size_t i = 0;
  while (i < symbols.size()) {
    size_t j = i;
    while (j < symbols.size() && symbols[j] == symbols[i]) ++j;
    const size_t run = j - i;
    const char ch = static_cast<char>(symbols[i]);
    if (run >= 3) {
      out += ch;
      out += '*';
      out += std::to_string(run);
    } else {
      out.append(run, ch);
    }
    i = j;
  }
  return out;
}

// A '(' , ')' or '*' left over after expansion: a nested group, an unclosed one, or a repetition of
// nothing. Megatron's grammar repeats flat groups only.
[[noreturn]] void group_error(std::string_view text, char ch) {
  size_t depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '(') {
      if (++depth > 1) {
        layout_error(
            text, "a group opens inside another group at position " + std::to_string(i),
            "groups cannot be nested (Megatron's grammar): write the inner group out, e.g. (tttt|)*2");
      }
    } else if (text[i] == ')') {
      if (depth == 0) {
        layout_error(text, "')' at position " + std::to_string(i) + " closes no group",
                     "open each group with '(' and repeat it with )*n, e.g. (tt|)*4");
      }
      --depth;
    }
  }
  if (depth > 0) {
    layout_error(text, "a group '(' is never closed", "close it and repeat it with )*n, e.g. (tt|)*4");
  }
  const size_t at = text.find(ch);
  layout_error(text,
               std::string("'") + ch + "'" +
                   (at != std::string_view::npos ? " at position " + std::to_string(at) : "") +
                   " is not part of a repetition",
               "repeat a group as (group)*n with n a number, or one symbol as x*n");
}

}  // namespace

std::string PipelineStage::to_string() const {
  std::string out;
  for (LayerSymbol symbol : symbols) out += static_cast<char>(symbol);
  return out;
}

std::string expand_layout_repetitions(std::string_view text) {
  if (static_cast<int64_t>(text.size()) > PipelineLayout::kMaxExpandedLength) {
    layout_error(text,
                 "it is longer than " + std::to_string(PipelineLayout::kMaxExpandedLength) + " characters",
                 "write it with (group)*n and x*n repetitions");
  }
  // layout_str.replace(",", "")
  std::string no_commas;
  for (char ch : text) {
    if (ch != ',') no_commas += ch;
  }
  // re.sub(r'\(([^)]+)\)\*(\d+)', lambda m: m.group(1) * int(m.group(2)), s)
  std::string groups_done;
  {
    const std::string_view s = no_commas;
    size_t i = 0;
    while (i < s.size()) {
      if (s[i] == '(') {
        const size_t close = s.find(')', i + 1);
        if (close != std::string_view::npos && close > i + 1 && close + 2 < s.size() + 0 &&
            s[close + 1] == '*' && is_digit(s[close + 2])) {
          size_t pos = close + 2;
          const int64_t count = read_count(s, pos);
          append_repeated(groups_done, s.substr(i + 1, close - i - 1), count, text);
          i = pos;
          continue;
        }
      }
      groups_done += s[i];
      if (static_cast<int64_t>(groups_done.size()) > PipelineLayout::kMaxExpandedLength) {
        append_repeated(groups_done, "", 0, text);
      }
      ++i;
    }
  }
  // re.sub(r'(.)\*(\d+)', lambda m: m.group(1) * int(m.group(2)), s)   ('.' is any char but '\n')
  std::string out;
  {
    const std::string_view s = groups_done;
    size_t i = 0;
    while (i < s.size()) {
      if (s[i] != '\n' && i + 2 < s.size() && s[i + 1] == '*' && is_digit(s[i + 2])) {
        size_t pos = i + 2;
        const int64_t count = read_count(s, pos);
        append_repeated(out, s.substr(i, 1), count, text);
        i = pos;
        continue;
      }
      out += s[i];
      ++i;
    }
  }
  return out;
}

PipelineLayout PipelineLayout::parse(std::string_view text, int pipeline_model_parallel_size) {
  if (pipeline_model_parallel_size < 1) {
    throw UserError("--pipeline-model-parallel-size " + std::to_string(pipeline_model_parallel_size) +
                    " must be >= 1");
  }
  const std::string expanded = expand_layout_repetitions(text);
  std::vector<std::vector<LayerSymbol>> stages(1);
  for (char ch : expanded) {
    switch (ch) {
      case '|':
        stages.emplace_back();
        break;
      case 'E':
      case 't':
      case 'm':
      case 'L':
        stages.back().push_back(static_cast<LayerSymbol>(ch));
        break;
      case '(':
      case ')':
      case '*':
        group_error(text, ch);
      default: {
        const size_t at = text.find(ch);
        const bool printable =
            static_cast<unsigned char>(ch) >= 0x20 && static_cast<unsigned char>(ch) < 0x7f;
        std::string what = printable ? std::string("'") + ch + "'"
                                     : "byte " + std::to_string(static_cast<unsigned char>(ch));
        if (at != std::string_view::npos) what += " at position " + std::to_string(at);
        layout_error(
            text, "invalid layer character " + what,
            "use only E (embedding), t (decoder layer), m (MTP layer), L (loss), '|' between stages, "
            "',' and repetitions (group)*n or x*n");
      }
    }
  }
  const int num_stages = static_cast<int>(stages.size());
  if (num_stages % pipeline_model_parallel_size != 0) {
    layout_error(text,
                 std::to_string(num_stages) +
                     " stages are not a multiple of --pipeline-model-parallel-size " +
                     std::to_string(pipeline_model_parallel_size),
                 "give pp x vpp stages separated by '|' (empty stages count)");
  }
  return from_stages(std::move(stages), pipeline_model_parallel_size);
}

PipelineLayout PipelineLayout::from_stages(std::vector<std::vector<LayerSymbol>> stages_in_global_order,
                                           int pipeline_model_parallel_size) {
  if (pipeline_model_parallel_size < 1 || stages_in_global_order.empty() ||
      stages_in_global_order.size() % pipeline_model_parallel_size != 0) {
    throw UserError(std::string(kFlag) + ": " + std::to_string(stages_in_global_order.size()) +
                    " stages do not fill --pipeline-model-parallel-size " +
                    std::to_string(pipeline_model_parallel_size) + " ranks evenly: give pp x vpp stages");
  }
  PipelineLayout layout;
  layout.pp_ = pipeline_model_parallel_size;
  int decoder_offset = 0;
  int mtp_offset = 0;
  for (size_t i = 0; i < stages_in_global_order.size(); ++i) {
    PipelineStage stage;
    stage.stage_index = static_cast<int>(i);
    stage.pp_rank = static_cast<int>(i) % layout.pp_;
    stage.vpp_rank = static_cast<int>(i) / layout.pp_;
    stage.symbols = std::move(stages_in_global_order[i]);
    stage.first_decoder_layer = decoder_offset;
    stage.first_mtp_layer = mtp_offset;
    for (LayerSymbol symbol : stage.symbols) {
      stage.num_decoder_layers += symbol == LayerSymbol::kDecoder;
      stage.num_mtp_layers += symbol == LayerSymbol::kMtp;
      stage.has_embedding = stage.has_embedding || symbol == LayerSymbol::kEmbedding;
      stage.has_loss = stage.has_loss || symbol == LayerSymbol::kLoss;
    }
    decoder_offset += stage.num_decoder_layers;
    mtp_offset += stage.num_mtp_layers;
    layout.stages_.push_back(std::move(stage));
  }
  return layout;
}

namespace {

void check_split_inputs(int num_layers, int pp, int vpp, int mtp_num_layers) {
  if (num_layers < 1) throw UserError("--num-layers " + std::to_string(num_layers) + " must be >= 1");
  if (pp < 1) throw UserError("--pipeline-model-parallel-size " + std::to_string(pp) + " must be >= 1");
  if (vpp < 1) throw UserError("virtual pipeline stages per rank " + std::to_string(vpp) + " must be >= 1");
  if (mtp_num_layers < 0)
    throw UserError("--mtp-num-layers " + std::to_string(mtp_num_layers) + " must be >= 0");
  if (static_cast<int64_t>(pp) * vpp > 1'000'000 || num_layers > 1'000'000 || mtp_num_layers > 1'000'000) {
    throw UserError(
        "--pipeline-model-parallel-size x virtual stages and --num-layers must stay below 1000000");
  }
}

// Stages in global order from per-stage decoder counts; E into stage 0, MTP + L into the last stage.
PipelineLayout assemble(const std::vector<int>& decoder_layers_per_stage, int pp, int mtp_num_layers) {
  std::vector<std::vector<LayerSymbol>> stages(decoder_layers_per_stage.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    if (i == 0) stages[i].push_back(LayerSymbol::kEmbedding);
    stages[i].insert(stages[i].end(), decoder_layers_per_stage[i], LayerSymbol::kDecoder);
    if (i + 1 == stages.size()) {
      stages[i].insert(stages[i].end(), mtp_num_layers, LayerSymbol::kMtp);
      stages[i].push_back(LayerSymbol::kLoss);
    }
  }
  return PipelineLayout::from_stages(std::move(stages), pp);
}

}  // namespace

PipelineLayout PipelineLayout::uniform(int num_layers, int pp, int vpp, int mtp_num_layers) {
  check_split_inputs(num_layers, pp, vpp, mtp_num_layers);
  const int num_stages = pp * vpp;
  if (num_layers % num_stages != 0) {
    throw UserError("--num-layers " + std::to_string(num_layers) + " does not split evenly over " +
                    std::to_string(pp) + " pipeline ranks x " + std::to_string(vpp) +
                    " virtual stages: use a layer count divisible by " + std::to_string(num_stages) +
                    ", --decoder-first/last-pipeline-num-layers, or --pipeline-model-parallel-layout");
  }
  return assemble(std::vector<int>(num_stages, num_layers / num_stages), pp, mtp_num_layers);
}

PipelineLayout PipelineLayout::uneven(int num_layers, int pp, int first_stage_layers, int last_stage_layers,
                                      int vpp, int mtp_num_layers) {
  check_split_inputs(num_layers, pp, vpp, mtp_num_layers);
  const bool has_first = first_stage_layers >= 0;
  const bool has_last = last_stage_layers >= 0;
  if (!has_first && !has_last) return uniform(num_layers, pp, vpp, mtp_num_layers);
  if (pp < 2) {
    throw UserError(
        "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1: drop them or "
        "raise pp");
  }
  if (has_first && has_last && pp == 2 && first_stage_layers + last_stage_layers != num_layers) {
    throw UserError("--decoder-first-pipeline-num-layers " + std::to_string(first_stage_layers) +
                    " + --decoder-last-pipeline-num-layers " + std::to_string(last_stage_layers) +
                    " must equal --num-layers " + std::to_string(num_layers) + " with 2 pipeline ranks");
  }
  const int middle_ranks = pp - (has_first ? 1 : 0) - (has_last ? 1 : 0);
  const int middle_layers =
      num_layers - (has_first ? first_stage_layers : 0) - (has_last ? last_stage_layers : 0);
  if (middle_layers < 0) {
    throw UserError("--decoder-first/last-pipeline-num-layers take more than --num-layers " +
                    std::to_string(num_layers) + " layers: lower them");
  }
  if (middle_ranks > 0 && middle_layers % middle_ranks != 0) {
    throw UserError("--num-layers " + std::to_string(num_layers) +
                    " minus the first/last stage layers leaves " + std::to_string(middle_layers) +
                    " layers that do not split evenly over the " + std::to_string(middle_ranks) +
                    " middle pipeline ranks: adjust --decoder-first/last-pipeline-num-layers");
  }
  const int per_middle_rank = middle_ranks > 0 ? middle_layers / middle_ranks : 0;
  std::vector<int> per_rank(pp, per_middle_rank);
  if (has_first) per_rank[0] = first_stage_layers;
  if (has_last) per_rank[pp - 1] = last_stage_layers;
  for (int r = 0; r < pp; ++r) {
    if (per_rank[r] % vpp != 0) {
      throw UserError(
          "pipeline rank " + std::to_string(r) + " holds " + std::to_string(per_rank[r]) +
          " layers, not divisible by the " + std::to_string(vpp) +
          " virtual stages per rank: adjust --decoder-first/last-pipeline-num-layers or the VPP size");
    }
  }
  std::vector<int> per_stage(pp * vpp);
  for (int v = 0; v < vpp; ++v) {
    for (int r = 0; r < pp; ++r) per_stage[v * pp + r] = per_rank[r] / vpp;
  }
  return assemble(per_stage, pp, mtp_num_layers);
}

PipelineLayout PipelineLayout::accounting_for_embedding_and_loss(int num_layers, int pp,
                                                                 bool account_for_embedding,
                                                                 bool account_for_loss, int vpp,
                                                                 int mtp_num_layers) {
  check_split_inputs(num_layers, pp, vpp, mtp_num_layers);
  const int total = num_layers + (account_for_embedding ? 1 : 0) + (account_for_loss ? 1 : 0);
  if (total % pp != 0) {
    throw UserError("--num-layers " + std::to_string(num_layers) + " plus the accounted embedding/loss (" +
                    std::to_string(total) + ") is not divisible by --pipeline-model-parallel-size " +
                    std::to_string(pp) +
                    ": change the layer count or drop --account-for-embedding/loss-in-pipeline-split");
  }
  const int per_rank = total / pp;
  if (per_rank % vpp != 0) {
    throw UserError(std::to_string(per_rank) +
                    " layers per pipeline rank (embedding/loss accounted) are not divisible by " +
                    std::to_string(vpp) + " virtual stages: change the VPP size or the layer count");
  }
  const int per_stage = per_rank / vpp;
  std::vector<int> per_stage_layers(pp * vpp, per_stage);
  if (account_for_embedding) per_stage_layers.front() -= 1;
  if (account_for_loss) per_stage_layers.back() -= 1;
  if (per_stage_layers.front() < 0 || per_stage_layers.back() < 0) {
    throw UserError(
        "a pipeline stage would hold fewer than zero decoder layers after accounting for embedding/loss: "
        "use fewer pipeline stages");
  }
  return assemble(per_stage_layers, pp, mtp_num_layers);
}

void PipelineLayout::validate(int num_layers, int mtp_num_layers) const {
  // The layout's text only for the error message; the checks read the symbols in order.
  const auto fail = [this](const std::string& problem, const std::string& fix) {
    layout_error(to_string(), problem, fix);
  };
  std::array<int, 256> counts{};
  char first = 0, last = 0;
  bool decoder_after_mtp = false;
  for (const PipelineStage& stage : stages_)
    for (LayerSymbol symbol : stage.symbols) {
      const char ch = static_cast<char>(symbol);
      if (first == 0) first = ch;
      last = ch;
      decoder_after_mtp = decoder_after_mtp || (symbol == LayerSymbol::kDecoder && counts['m'] > 0);
      ++counts[static_cast<unsigned char>(ch)];
    }
  const auto count = [&](char ch) { return counts[static_cast<unsigned char>(ch)]; };
  if (first != 'E') fail("the first layer must be the embedding E", "start the first stage with E");
  if (last != 'L') fail("the last layer must be the loss L", "end the last stage with L");
  if (count('E') != 1)
    fail(std::to_string(count('E')) + " embeddings E", "write exactly one E, in the first stage");
  if (count('L') != 1)
    fail(std::to_string(count('L')) + " losses L", "write exactly one L, in the last stage");
  if (!stages_.front().has_embedding) {
    fail("E is not in the first stage (pp rank 0, virtual stage 0)",
         "put E in the first stage: Megatron embeds on the first virtual stage");
  }
  if (!stages_.back().has_loss) {
    fail("L is not in the last stage (last pp rank, last virtual stage)",
         "put L in the last stage: Megatron computes the loss on the last virtual stage");
  }
  if (count('t') != num_layers) {
    fail("it holds " + std::to_string(count('t')) + " decoder layers t but --num-layers is " +
             std::to_string(num_layers),
         "write exactly num-layers t");
  }
  if (count('m') != mtp_num_layers) {
    fail("it holds " + std::to_string(count('m')) + " MTP layers m but --mtp-num-layers is " +
             std::to_string(mtp_num_layers),
         "write exactly mtp-num-layers m");
  }
  if (decoder_after_mtp) fail("a decoder layer t follows an MTP layer m", "put every m after the last t");
  int mtp_stages = 0;
  for (const PipelineStage& stage : stages_) {
    if (stage.num_mtp_layers == 0) continue;
    ++mtp_stages;
    if (stage.vpp_rank != vpp() - 1) {
      fail("MTP layers sit in stage " + std::to_string(stage.stage_index) + " (pp rank " +
               std::to_string(stage.pp_rank) + ", virtual stage " + std::to_string(stage.vpp_rank) +
               "), not in the last virtual stage of a rank",
           "move m into one of the last " + std::to_string(pp_) + " stages");
    }
    if (pp_ > 1 && stage.pp_rank == 0) {
      fail("MTP layers sit on pipeline rank 0", "move m to a later pipeline rank");
    }
  }
  if (mtp_stages > 1) {
    fail("MTP layers are spread over " + std::to_string(mtp_stages) + " stages", "put all m in one stage");
  }
}

const PipelineStage& PipelineLayout::stage(int pp_rank, int vpp_rank) const {
  const int index = vpp_rank * pp_ + pp_rank;
  if (pp_rank < 0 || pp_rank >= pp_ || vpp_rank < 0 || index >= num_stages()) {
    throw std::out_of_range("PipelineLayout::stage(" + std::to_string(pp_rank) + ", " +
                            std::to_string(vpp_rank) + ") outside pp " + std::to_string(pp_) + " x vpp " +
                            std::to_string(vpp()));
  }
  return stages_[index];
}

std::vector<const PipelineStage*> PipelineLayout::stages_of_rank(int pp_rank) const {
  std::vector<const PipelineStage*> out;
  for (int v = 0; v < vpp(); ++v) out.push_back(&stage(pp_rank, v));
  return out;
}

int PipelineLayout::num_decoder_layers() const {
  int total = 0;
  for (const PipelineStage& stage : stages_) total += stage.num_decoder_layers;
  return total;
}

int PipelineLayout::num_mtp_layers() const {
  int total = 0;
  for (const PipelineStage& stage : stages_) total += stage.num_mtp_layers;
  return total;
}

bool PipelineLayout::mtp_standalone() const {
  for (const PipelineStage& stage : stages_) {
    if (stage.num_mtp_layers > 0 && stage.vpp_rank == vpp() - 1 && stage.pp_rank != pp_ - 1) return true;
  }
  return false;
}

std::string PipelineLayout::to_string() const {
  std::vector<std::string> pieces;
  for (const PipelineStage& stage : stages_) pieces.push_back(stage_rle(stage.symbols));
  std::string out;
  const size_t n = pieces.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && pieces[j] == pieces[i]) ++j;
    const size_t run = j - i;
    const bool final_run = j == n;
    if (run >= 3) {
      // "(S|)*k" repeats S with its separator; a final run keeps its last S outside so no empty stage
      // follows.
      out += "(" + pieces[i] + "|)*" + std::to_string(final_run ? run - 1 : run);
      if (final_run) out += pieces[i];
    } else {
      for (size_t k = i; k < j; ++k) {
        out += pieces[k];
        if (k + 1 < n) out += '|';
      }
    }
    i = j;
  }
  return out;
}

std::string PipelineLayout::expanded_string() const {
  std::string out;
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (i > 0) out += '|';
    out += stages_[i].to_string();
  }
  return out;
}

bool operator==(const PipelineLayout& a, const PipelineLayout& b) {
  if (a.pp_ != b.pp_ || a.stages_.size() != b.stages_.size()) return false;
  for (size_t i = 0; i < a.stages_.size(); ++i) {
    if (a.stages_[i].symbols != b.stages_[i].symbols) return false;
  }
  return true;
}

}  // namespace megatune::layouts
