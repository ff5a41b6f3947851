// GPTDataset: Megatron's sample assembly (gpt_dataset.py _query_document_sample_shuffle_indices) over
// the indices of gpt_dataset_indices.cpp.
#include "executor/data/gpt_dataset.h"

#include <algorithm>
#include <vector>

#include "base/user_error.h"

namespace megatune::executor::data {

namespace {
constexpr int32_t kPaddingMarker = -1;  // Megatron's _PAD_TOKEN_ID for a tokenizer without a pad id
}

GPTDataset::GPTDataset(std::shared_ptr<const SequenceSource> source, std::vector<int32_t> sequence_ids,
                       int64_t num_samples, GPTDatasetConfig config)
    : source_(std::move(source)), sequence_ids_(std::move(sequence_ids)), config_(config) {
  if (!source_) throw std::invalid_argument("GPTDataset needs a sequence source");
  if (config_.sequence_length < 1) {
    throw UserError("--seq-length must be positive, got " + std::to_string(config_.sequence_length));
  }
  if (config_.eod_mask_loss && config_.eod_token < 0) {
    throw UserError("--eod-mask-loss needs the tokenizer's EOD token id");
  }
  GPTIndexConfig index_config;
  index_config.sequence_length = config_.sequence_length;
  index_config.random_seed = config_.random_seed;
  index_config.extra_tokens = config_.add_extra_token_to_sequence ? 1 : 0;
  index_config.drop_last_partial_sequence = config_.drop_last_partial_sequence;
  indices_ = build_gpt_dataset_indices(source_->sequence_lengths(), sequence_ids_, num_samples, index_config,
                                       source_->description());
}

int64_t GPTDataset::read_sample_text(int64_t index, int32_t* text) const {
  if (index < 0 || index >= num_samples()) {
    throw std::out_of_range("GPTDataset sample " + std::to_string(index) + " of " +
                            std::to_string(num_samples()));
  }
  const int64_t extra = config_.add_extra_token_to_sequence ? 1 : 0;
  const int64_t wanted = config_.sequence_length + extra;
  const int64_t j = indices_.shuffle_index[static_cast<size_t>(index)];
  const int64_t begin_position = indices_.sample_index[static_cast<size_t>(2 * j)];
  const int64_t begin_offset = indices_.sample_index[static_cast<size_t>(2 * j + 1)];
  const int64_t end_position = indices_.sample_index[static_cast<size_t>(2 * j + 2)];
  const int64_t end_offset = indices_.sample_index[static_cast<size_t>(2 * j + 3)];
  const auto& lengths = source_->sequence_lengths();
  int64_t filled = 0;
  for (int64_t position = begin_position; position <= end_position; ++position) {
    const int32_t document = indices_.document_index[static_cast<size_t>(position)];
    const int64_t offset = position == begin_position ? begin_offset : 0;
    const int64_t stop = position == end_position
                             ? end_offset + extra
                             : static_cast<int64_t>(lengths[static_cast<size_t>(document)]);
    const int64_t length = std::min(stop - offset, wanted - filled);
    if (length <= 0) continue;
    source_->read_tokens(document, offset, length, text + filled);
    filled += length;
  }
  if (config_.vocab_size > 0) {
    for (int64_t i = 0; i < filled; ++i) {
      if (text[i] < 0 || text[i] >= config_.vocab_size) {
        throw UserError(source_->description() + " holds token id " + std::to_string(text[i]) +
                        " outside the vocabulary of " + std::to_string(config_.vocab_size) +
                        "; pass the --vocab-size the data was tokenized with or re-run preprocessing");
      }
    }
  }
  for (int64_t i = filled; i < wanted; ++i) text[i] = kPaddingMarker;
  return filled;
}

void GPTDataset::get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const {
  const int64_t s = config_.sequence_length;
  thread_local std::vector<int32_t> text;
  text.resize(static_cast<size_t>(s + 1));
  read_sample_text(index, text.data());
  if (config_.add_extra_token_to_sequence) {
    for (int64_t i = 0; i < s; ++i) {
      tokens[i] = text[static_cast<size_t>(i)];
      labels[i] = text[static_cast<size_t>(i + 1)];
    }
  } else {
    for (int64_t i = 0; i < s; ++i) {
      tokens[i] = text[static_cast<size_t>(i)];
      labels[i] = i + 1 < s ? text[static_cast<size_t>(i + 1)] : kPaddingMarker;
    }
  }
  for (int64_t i = 0; i < s; ++i) {
    float mask = 1.0f;
    if (config_.eod_mask_loss && tokens[i] == config_.eod_token) mask = 0.0f;
    if (labels[i] == kPaddingMarker) mask = 0.0f;
    loss_mask[i] = mask;
    if (tokens[i] == kPaddingMarker) tokens[i] = config_.pad_token;
    if (labels[i] == kPaddingMarker) labels[i] = config_.pad_token;
  }
}

std::string GPTDataset::description() const {
  return "GPT samples of " + std::to_string(config_.sequence_length) + " tokens over " +
         source_->description();
}

}  // namespace megatune::executor::data
