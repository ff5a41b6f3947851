// Index building of Megatron's GPTDataset: split boundaries, epochs, document/sample/shuffle indices.
#include "executor/data/gpt_dataset_indices.h"

#include <cmath>
#include <cstdlib>
#include <numeric>

#include "base/user_error.h"

namespace megatune::executor::data {

std::array<double, 3> parse_split(const std::string& split) {
  std::array<double, 3> weights{0.0, 0.0, 0.0};
  size_t count = 0;
  size_t start = 0;
  const auto bad = [&](const std::string& why) {
    return UserError("--split '" + split + "': " + why +
                     "; give up to 3 non-negative weights such as 969,30,1");
  };
  while (start <= split.size()) {
    size_t end = split.find_first_of(",/", start);
    if (end == std::string::npos) end = split.size();
    const std::string piece = split.substr(start, end - start);
    if (piece.empty()) throw bad("empty weight");
    if (count == 3) throw bad("more than 3 weights");
    char* parse_end = nullptr;
    const double value = std::strtod(piece.c_str(), &parse_end);
    if (parse_end != piece.c_str() + piece.size() || !std::isfinite(value) || value < 0) {
      throw bad("'" + piece + "' is not a non-negative number");
    }
    weights[count++] = value;
    start = end + 1;
  }
  const double total = weights[0] + weights[1] + weights[2];
  if (!(total > 0)) throw bad("the weights sum to 0");
  for (double& weight : weights) weight /= total;
  return weights;
}

std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& normalized_split, int64_t num_elements) {
  std::array<int64_t, 4> boundaries{0, 0, 0, 0};
  for (size_t i = 0; i < 3; ++i) {
    // Python's round(): half to even, which nearbyint does in the default rounding mode.
    boundaries[i + 1] =
        boundaries[i] +
        static_cast<int64_t>(std::nearbyint(normalized_split[i] * static_cast<double>(num_elements)));
  }
  const int64_t overshoot = boundaries[3] - num_elements;
  for (size_t i = 1; i < 4; ++i) boundaries[i] -= overshoot;
  return boundaries;
}

int64_t compute_num_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t sequence_length,
                           int64_t extra_tokens) {
  if (num_samples < 0) return 1;
  const int64_t tokens_requested = num_samples * sequence_length + extra_tokens;
  int64_t epochs = 1;
  int64_t tokens = tokens_per_epoch;
  while (tokens < tokens_requested) {
    tokens += tokens_per_epoch;
    ++epochs;
  }
  return epochs;
}

std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& random_state, bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> document_index;
    document_index.reserve(documents.size() * static_cast<size_t>(num_epochs));
    for (int64_t epoch = 0; epoch < num_epochs; ++epoch) {
      document_index.insert(document_index.end(), documents.begin(), documents.end());
    }
    random_state.shuffle(std::span<int32_t>(document_index));
    return document_index;
  }
  std::vector<int32_t> first = build_document_index(documents, num_epochs - 1, random_state, false);
  const std::vector<int32_t> last = build_document_index(documents, 1, random_state, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sequence_lengths,
                                        std::span<const int32_t> document_index, int64_t sequence_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, int64_t extra_tokens) {
  const int64_t total_tokens = num_epochs * tokens_per_epoch - extra_tokens;
  int64_t num_samples;
  if (drop_last_partial_sequence) {
    num_samples = total_tokens / sequence_length;
  } else {
    // helpers.cpp: ceil(float(num_epochs * tokens_per_epoch - extra) / seq_length), in float32.
    num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(total_tokens) / static_cast<float>(sequence_length)));
  }
  if (sequence_length < 1 || num_samples < 1 || document_index.empty()) {
    throw UserError("the dataset split holds " + std::to_string(tokens_per_epoch) +
                    " tokens, too few for one sample of " + std::to_string(sequence_length + extra_tokens) +
                    " tokens; use more data, a larger --split share or a shorter --seq-length");
  }
  std::vector<int64_t> sample_index(static_cast<size_t>(2 * (num_samples + 1)));
  const int64_t document_index_size = static_cast<int64_t>(document_index.size());
  int64_t sample = 0;
  int64_t position = 0;  // into document_index
  int64_t offset = 0;    // token offset in that document
  sample_index[0] = position;
  sample_index[1] = offset;
  ++sample;
  while (sample <= num_samples) {
    int64_t remaining = sequence_length + extra_tokens;
    while (remaining != 0) {
      const int64_t document = document_index[static_cast<size_t>(position)];
      const int64_t document_length = sequence_lengths[static_cast<size_t>(document)] - offset;
      remaining -= document_length;
      if (remaining <= 0) {
        offset += remaining + document_length - extra_tokens;
        remaining = 0;
      } else {
        if (position == document_index_size - 1) {
          offset = sequence_lengths[static_cast<size_t>(document_index[static_cast<size_t>(position)])] -
                   extra_tokens;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    sample_index[static_cast<size_t>(2 * sample)] = position;
    sample_index[static_cast<size_t>(2 * sample + 1)] = offset;
    ++sample;
  }
  return sample_index;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         NumpyRandomState& random_state) {
  std::vector<int64_t> shuffle_index(static_cast<size_t>(total_size));
  std::iota(shuffle_index.begin(), shuffle_index.end(), int64_t{0});
  random_state.shuffle(std::span<int64_t>(shuffle_index.data(), static_cast<size_t>(num_samples)));
  if (num_samples == total_size) return shuffle_index;
  random_state.shuffle(
      std::span<int64_t>(shuffle_index.data() + num_samples, static_cast<size_t>(total_size - num_samples)));
  return shuffle_index;
}

GPTDatasetIndices build_gpt_dataset_indices(std::span<const int32_t> sequence_lengths,
                                            std::span<const int32_t> documents, int64_t num_samples,
                                            const GPTIndexConfig& config, const std::string& description) {
  if (config.sequence_length < 1) throw UserError("--seq-length must be positive for " + description);
  if (documents.empty()) {
    throw UserError(description + ": the split holds no sequences; use a larger --split share or more data");
  }
  GPTDatasetIndices indices;
  for (const int32_t document : documents) {
    if (document < 0 || static_cast<size_t>(document) >= sequence_lengths.size()) {
      throw UserError(description + ": sequence id " + std::to_string(document) + " is outside the dataset");
    }
    indices.tokens_per_epoch += sequence_lengths[static_cast<size_t>(document)];
  }
  const int64_t s = config.sequence_length;
  const int64_t extra = config.extra_tokens;
  if (indices.tokens_per_epoch < s + extra) {
    throw UserError(description + ": the split holds " + std::to_string(indices.tokens_per_epoch) +
                    " tokens, too few for one sample of " + std::to_string(s + extra) +
                    " tokens; use more data, a larger --split share or a shorter --seq-length");
  }
  indices.num_epochs = compute_num_epochs(indices.tokens_per_epoch, num_samples, s, extra);
  if (indices.num_epochs > 1) {
    indices.num_samples_sans_final_epoch = ((indices.num_epochs - 1) * indices.tokens_per_epoch - extra) / s;
    const int64_t from_final_epoch = num_samples - indices.num_samples_sans_final_epoch;
    const int64_t per_epoch = (indices.tokens_per_epoch - extra) / s;
    indices.separate_final_epoch =
        from_final_epoch < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState random_state(config.random_seed);
  indices.document_index =
      build_document_index(documents, indices.num_epochs, random_state, indices.separate_final_epoch);
  indices.sample_index =
      build_sample_index(sequence_lengths, indices.document_index, s, indices.num_epochs,
                         indices.tokens_per_epoch, config.drop_last_partial_sequence, extra);
  const int64_t total = static_cast<int64_t>(indices.sample_index.size() / 2) - 1;
  indices.shuffle_index = build_shuffle_index(
      indices.separate_final_epoch ? indices.num_samples_sans_final_epoch : total, total, random_state);
  return indices;
}

}  // namespace megatune::executor::data
