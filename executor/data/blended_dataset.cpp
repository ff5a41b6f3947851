// BlendedDataset: weighted mixture of sample datasets with Megatron's blending indices.
#include "executor/data/blended_dataset.h"

#include <cmath>
#include <limits>
#include <set>

#include "base/user_error.h"

namespace megatune::executor::data {

std::vector<double> normalize_blend_weights(std::span<const double> weights) {
  double total = 0;
  for (const double weight : weights) {
    if (!std::isfinite(weight) || weight < 0) {
      throw UserError("--data-path weight " + std::to_string(weight) + " is not a non-negative number");
    }
    total += weight;
  }
  if (!(total > 0)) throw UserError("--data-path weights sum to 0; give at least one positive weight");
  std::vector<double> normalized(weights.begin(), weights.end());
  for (double& weight : normalized) weight /= total;
  return normalized;
}

BlendingIndices build_blending_indices(std::span<const double> normalized_weights, int64_t size) {
  if (normalized_weights.size() > static_cast<size_t>(std::numeric_limits<int16_t>::max())) {
    throw UserError("--data-path blends " + std::to_string(normalized_weights.size()) +
                    " datasets; at most 32767 are supported");
  }
  BlendingIndices indices;
  indices.dataset_index.resize(static_cast<size_t>(size));
  indices.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> current(normalized_weights.size(), 0);
  for (int64_t sample = 0; sample < size; ++sample) {
    const double sample_double = std::max(static_cast<double>(sample), 1.0);
    size_t best = 0;
    double best_error = normalized_weights[0] * sample_double - static_cast<double>(current[0]);
    for (size_t d = 1; d < normalized_weights.size(); ++d) {
      const double error = normalized_weights[d] * sample_double - static_cast<double>(current[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    indices.dataset_index[static_cast<size_t>(sample)] = static_cast<int16_t>(best);
    indices.dataset_sample_index[static_cast<size_t>(sample)] = current[best];
    ++current[best];
  }
  return indices;
}

BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes) {
  if (sizes.size() > static_cast<size_t>(std::numeric_limits<int16_t>::max())) {
    throw UserError("--data-path blends " + std::to_string(sizes.size()) +
                    " datasets; at most 32767 are supported");
  }
  int64_t total = 0;
  for (const int64_t size : sizes) total += size;
  std::vector<double> weights;
  for (const int64_t size : sizes) weights.push_back(static_cast<double>(size) / static_cast<double>(total));
  std::vector<int64_t> counts(sizes.size(), 0);
  std::set<size_t> unspent;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 0) unspent.insert(d);
  }
  BlendingIndices indices;
  indices.dataset_index.reserve(static_cast<size_t>(total));
  indices.dataset_sample_index.reserve(static_cast<size_t>(total));
  int64_t sample = 0;
  while (!unspent.empty()) {
    const double sample_double = std::max(static_cast<double>(sample), 1.0);
    size_t best = *unspent.begin();
    double best_error = std::numeric_limits<double>::lowest();
    for (const size_t d : unspent) {
      const double error = weights[d] * sample_double - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    indices.dataset_index.push_back(static_cast<int16_t>(best));
    indices.dataset_sample_index.push_back(counts[best]);
    if (++counts[best] == sizes[best]) unspent.erase(best);
    ++sample;
  }
  return indices;
}

std::vector<int64_t> blend_per_dataset_num_samples(std::span<const double> normalized_weights, int64_t size,
                                                   double surplus) {
  std::vector<int64_t> sizes;
  sizes.reserve(normalized_weights.size());
  for (const double weight : normalized_weights) {
    sizes.push_back(
        static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(size) * weight) * (1.0 + surplus))));
  }
  return sizes;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                               std::vector<double> weights, int64_t size)
    : datasets_(std::move(datasets)) {
  if (datasets_.empty() || datasets_.size() != weights.size()) {
    throw std::invalid_argument("BlendedDataset needs one weight per dataset");
  }
  weights_ = normalize_blend_weights(weights);
  indices_ = build_blending_indices(weights_, size);
  check_datasets();
}

std::shared_ptr<BlendedDataset> BlendedDataset::exhaustive(
    std::vector<std::shared_ptr<const SampleDataset>> datasets) {
  if (datasets.empty()) throw std::invalid_argument("BlendedDataset needs at least one dataset");
  std::shared_ptr<BlendedDataset> blend(new BlendedDataset());
  std::vector<int64_t> sizes;
  std::vector<double> weights;
  for (const auto& dataset : datasets) {
    sizes.push_back(dataset->num_samples());
    weights.push_back(static_cast<double>(dataset->num_samples()));
  }
  blend->datasets_ = std::move(datasets);
  blend->weights_ = normalize_blend_weights(weights);
  blend->indices_ = build_exhaustive_blending_indices(sizes);
  blend->check_datasets();
  return blend;
}

void BlendedDataset::check_datasets() const {
  for (const auto& dataset : datasets_) {
    if (dataset->sequence_length() != datasets_.front()->sequence_length()) {
      throw UserError("blended datasets differ in sequence length (" + dataset->description() + " vs " +
                      datasets_.front()->description() + ")");
    }
  }
  std::vector<int64_t> drawn(datasets_.size(), 0);
  for (size_t i = 0; i < indices_.dataset_index.size(); ++i) {
    auto& count = drawn[static_cast<size_t>(indices_.dataset_index[i])];
    count = std::max(count, indices_.dataset_sample_index[i] + 1);
  }
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (drawn[d] > datasets_[d]->num_samples()) {
      throw UserError("the blend draws " + std::to_string(drawn[d]) + " samples from " +
                      datasets_[d]->description() + " which holds " +
                      std::to_string(datasets_[d]->num_samples()) +
                      "; build it with blend_per_dataset_num_samples or lower its --data-path weight");
    }
  }
}

void BlendedDataset::get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const {
  if (index < 0 || index >= num_samples()) {
    throw std::out_of_range("BlendedDataset sample " + std::to_string(index) + " of " +
                            std::to_string(num_samples()));
  }
  const auto dataset = static_cast<size_t>(indices_.dataset_index[static_cast<size_t>(index)]);
  datasets_[dataset]->get_sample(indices_.dataset_sample_index[static_cast<size_t>(index)], tokens, labels,
                                 loss_mask);
}

std::string BlendedDataset::description() const {
  std::string text = "blend of";
  for (size_t d = 0; d < datasets_.size(); ++d) {
    text += (d == 0 ? " " : ", ") + std::to_string(weights_[d]) + " x " + datasets_[d]->description();
  }
  return text;
}

}  // namespace megatune::executor::data
