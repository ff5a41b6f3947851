// The index building of Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py, helpers.cpp),
// reproduced exactly so that a megatune run reads the same samples in the same order as Megatron-LM.
//
// How the indices are built (verify against Megatron with the same corpus, split, seed and sample count):
//   split:    "969,30,1" -> weights normalized to sum 1 (missing entries are 0); boundaries b_0 = 0,
//             b_{i+1} = b_i + round(w_i * N) (Python round: half to even), then every b_{i>0} is shifted
//             by N - b_3 so the last one is N (utils.get_split_indices). Split i = sequences [b_i, b_{i+1}).
//   epochs:   T = sum of the split's sequence lengths; e = smallest e >= 1 with e*T >= num_samples*s + 1.
//   separate final epoch: when e > 1, n_sans = ((e-1)*T - 1) // s, n_final = num_samples - n_sans,
//             n_epoch = (T - 1) // s; separate iff n_final < int(0.8 * n_epoch).
//   RNG:      one NumpyRandomState(seed) drawn in this order: document index shuffle(s), then shuffle index.
//   document index: the split's sequence ids tiled e times (int32), shuffled; when separate, the first e-1
//             epochs are tiled and shuffled, then the last epoch is shuffled on its own and appended.
//   sample index (helpers.cpp build_sample_idx): n = (e*T - 1) // s samples (ceil of the float32 division
//             when the last partial sample is kept). Entry 0 = (0, 0). Each sample needs s+1 tokens; walk
//             the document index: remaining -= doc_len - offset; if remaining <= 0 the sample ends inside
//             this document at offset += remaining + doc_len - 1 (the extra token is shared with the next
//             sample); otherwise move to the next document with offset 0.
//   shuffle index: arange(n) shuffled; when separate, arange(n_sans) and arange(n_sans, n) are shuffled
//             separately and concatenated.
//   sample k: j = shuffle[k]; tokens from (doc_index[sample[j].doc], sample[j].offset) up to and including
//             (doc_index[sample[j+1].doc], sample[j+1].offset), i.e. s+1 tokens; x[:-1] -> tokens,
//             x[1:] -> labels.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "executor/data/numpy_random.h"

namespace megatune::executor::data {

// "969,30,1" -> {0.969, 0.030, 0.001}. Throws UserError naming --split for malformed or all-zero input.
std::array<double, 3> parse_split(const std::string& split);
// The 4 boundaries of the train/valid/test splits over num_elements sequences (utils.get_split_indices).
std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& normalized_split, int64_t num_elements);

// Smallest number of epochs over tokens_per_epoch tokens that yields num_samples samples of
// sequence_length (+ extra_tokens) tokens (GPTDataset._get_num_epochs). num_samples < 0: one epoch.
int64_t compute_num_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t sequence_length,
                           int64_t extra_tokens);

// _build_document_index: `documents` tiled num_epochs times and shuffled (see above).
std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& random_state, bool separate_final_epoch);

// helpers.cpp build_sample_idx: (n + 1) pairs (position in document_index, token offset), flattened.
// Throws UserError when the documents hold too few tokens for one sample.
std::vector<int64_t> build_sample_index(std::span<const int32_t> sequence_lengths,
                                        std::span<const int32_t> document_index, int64_t sequence_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, int64_t extra_tokens);

// _build_shuffle_index: arange(num_samples) shuffled, then arange(num_samples, total_size) shuffled.
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size,
                                         NumpyRandomState& random_state);

struct GPTIndexConfig {
  int64_t sequence_length = 0;  // s
  uint32_t random_seed = 1234;
  int64_t extra_tokens = 1;  // add_extra_token_to_sequence
  bool drop_last_partial_sequence = true;
};

struct GPTDatasetIndices {
  int64_t tokens_per_epoch = 0;
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // meaningful when separate_final_epoch
  std::vector<int32_t> document_index;       // (num_epochs * split sequences)
  std::vector<int64_t> sample_index;         // (n + 1, 2) flattened
  std::vector<int64_t> shuffle_index;        // (n)
  int64_t num_samples() const { return static_cast<int64_t>(shuffle_index.size()); }
};

// All three indices for the sequences `documents` of a source (GPTDataset._build_document_sample_shuffle
// _indices). num_samples < 0 means one epoch. Throws UserError when the split is empty or too small.
GPTDatasetIndices build_gpt_dataset_indices(std::span<const int32_t> sequence_lengths,
                                            std::span<const int32_t> documents, int64_t num_samples,
                                            const GPTIndexConfig& config, const std::string& description);

}  // namespace megatune::executor::data
