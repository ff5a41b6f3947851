// BlendedDataset: Megatron's weighted mixture of several SampleDatasets (blended_dataset.py with
// helpers.cpp build_blending_indices): sample i goes to the dataset furthest behind its weight.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/data/sample_dataset.h"

namespace megatune::executor::data {

struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // (size) which dataset sample i comes from
  std::vector<int64_t> dataset_sample_index;  // (size) the sample within that dataset
};

// Weights divided by their sum. Throws UserError (naming --data-path) for a negative or all-zero weight.
std::vector<double> normalize_blend_weights(std::span<const double> weights);
// helpers.cpp build_blending_indices: for i in [0, size): d = argmax_d (w_d * max(i, 1) - count_d)
// (first on ties), dataset_index[i] = d, dataset_sample_index[i] = count_d++.
BlendingIndices build_blending_indices(std::span<const double> normalized_weights, int64_t size);
// helpers.cpp build_exhaustive_blending_indices: draws exactly sizes[d] samples from each dataset, in
// proportion w_d = sizes[d] / total, skipping datasets already spent (Megatron's blend without weights).
BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes);
// Samples to request from each dataset of a blend of `size` samples:
// ceil(ceil(size * w_d) * (1 + surplus)) (BlendedMegatronDatasetBuilder, surplus 0.005).
std::vector<int64_t> blend_per_dataset_num_samples(std::span<const double> normalized_weights, int64_t size,
                                                   double surplus = 0.005);

class BlendedDataset final : public SampleDataset {
 public:
  // Throws UserError if the datasets differ in sequence length or one holds fewer samples than the
  // blend draws from it.
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                 int64_t size);
  // Megatron's blend without weights and without a size: every sample of every dataset exactly once,
  // interleaved in proportion to the dataset sizes (build_exhaustive_blending_indices).
  static std::shared_ptr<BlendedDataset> exhaustive(
      std::vector<std::shared_ptr<const SampleDataset>> datasets);

  int64_t num_samples() const override { return static_cast<int64_t>(indices_.dataset_index.size()); }
  int64_t sequence_length() const override { return datasets_.front()->sequence_length(); }
  void get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const override;
  std::string description() const override;
  const BlendingIndices& indices() const { return indices_; }

 private:
  BlendedDataset() = default;
  void check_datasets() const;

  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<double> weights_;  // normalized
  BlendingIndices indices_;
};

}  // namespace megatune::executor::data
