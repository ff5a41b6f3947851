// Builds the train/valid/test datasets of a run from --data-path / --mock-data, --split and sample counts.
#include "executor/data/dataset_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "base/user_error.h"
#include "executor/data/blended_dataset.h"
#include "executor/data/indexed_dataset.h"

namespace megatune::executor::data {

namespace {

bool parse_weight(const std::string& text, double& weight) {
  if (text.empty()) return false;
  char* end = nullptr;
  weight = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(weight);
}

const char* kSplitNames[3] = {"train", "valid", "test"};

}  // namespace

std::vector<DataBlendEntry> parse_data_path(const std::vector<std::string>& data_path) {
  if (data_path.empty()) throw UserError("--data-path is empty; give a dataset prefix or use --mock-data");
  double weight = 0;
  std::vector<DataBlendEntry> entries;
  if (data_path.size() >= 2 && parse_weight(data_path[0], weight)) {
    if (data_path.size() % 2 != 0) {
      throw UserError("--data-path mixes weights and prefixes (" + std::to_string(data_path.size()) +
                      " items); give 'WEIGHT PREFIX' pairs or only prefixes");
    }
    for (size_t i = 0; i < data_path.size(); i += 2) {
      if (!parse_weight(data_path[i], weight)) {
        throw UserError("--data-path item '" + data_path[i] + "' should be a weight before prefix '" +
                        data_path[i + 1] + "'");
      }
      entries.push_back({weight, data_path[i + 1], true});
    }
  } else {
    for (const auto& prefix : data_path) entries.push_back({1.0, prefix});
  }
  for (const auto& entry : entries) {
    if (entry.weight < 0) throw UserError("--data-path weight for " + entry.path_prefix + " is negative");
    for (const char* suffix : {".bin", ".idx"}) {
      const std::string s(suffix);
      if (entry.path_prefix.size() > 4 &&
          entry.path_prefix.compare(entry.path_prefix.size() - 4, 4, s) == 0) {
        throw UserError("--data-path " + entry.path_prefix + ": give the prefix without " + s);
      }
    }
  }
  return entries;
}

TrainValidTestDatasets build_train_valid_test_datasets(const DataConfig& config,
                                                       const std::array<int64_t, 3>& num_samples) {
  const auto normalized_split = parse_split(config.split);
  std::vector<DataBlendEntry> entries;
  std::vector<std::shared_ptr<const SequenceSource>> sources;
  if (config.mock_data) {
    MockDataConfig mock = config.mock;
    mock.vocab_size = config.gpt.vocab_size;
    mock.eod_token = config.gpt.eod_token;
    sources.push_back(std::make_shared<MockSequenceSource>(mock));
    entries.push_back({1.0, "mock"});
  } else {
    entries = parse_data_path(config.data_path);
    for (const auto& entry : entries) sources.push_back(std::make_shared<IndexedDataset>(entry.path_prefix));
  }
  std::vector<double> weights;
  for (const auto& entry : entries) weights.push_back(entry.weight);
  weights = normalize_blend_weights(weights);
  const bool weighted_blend = sources.size() > 1 && entries.front().weighted;

  TrainValidTestDatasets result;
  std::shared_ptr<const SampleDataset>* outputs[3] = {&result.train, &result.valid, &result.test};
  for (size_t part = 0; part < 3; ++part) {
    const int64_t requested = num_samples[part];
    const std::string split_name = kSplitNames[part];
    if (requested == 0 || normalized_split[part] == 0) {
      if (requested > 0) {
        throw UserError("--split " + config.split + " gives the " + split_name + " split no share but " +
                        std::to_string(requested) + " " + split_name +
                        " samples are needed; give that split a non-zero weight");
      }
      continue;
    }
    // Samples asked of each dataset: the split's samples for one dataset, weighted shares (with
    // Megatron's 0.5% surplus) for a weighted blend, one epoch (-1) for an unweighted blend.
    std::vector<int64_t> per_dataset(sources.size(), requested);
    if (weighted_blend && requested > 0) per_dataset = blend_per_dataset_num_samples(weights, requested);
    if (sources.size() > 1 && !weighted_blend) per_dataset.assign(sources.size(), -1);
    std::vector<std::shared_ptr<const SampleDataset>> datasets;
    for (size_t d = 0; d < sources.size(); ++d) {
      const auto bounds = split_boundaries(normalized_split, sources[d]->num_sequences());
      if (bounds[part + 1] <= bounds[part]) {
        if (requested > 0 && !(part > 0 && config.skip_empty_evaluation_splits)) {
          throw UserError("--split " + config.split + " leaves the " + split_name + " split of " +
                          sources[d]->description() + " without sequences but " + std::to_string(requested) +
                          " " + split_name + " samples are needed; give that split a share or use more data");
        }
        datasets.clear();
        break;
      }
      std::vector<int32_t> ids;
      for (int64_t i = bounds[part]; i < bounds[part + 1]; ++i) ids.push_back(static_cast<int32_t>(i));
      datasets.push_back(
          std::make_shared<GPTDataset>(sources[d], std::move(ids), per_dataset[d], config.gpt));
    }
    if (datasets.empty()) continue;
    if (datasets.size() == 1) {
      *outputs[part] = datasets.front();
    } else if (weighted_blend) {
      int64_t size = requested;
      if (size < 0) {
        // No size requested: as many samples as the one-epoch datasets give without running out (the
        // blending rule keeps each count within 1 of weight * samples).
        size = std::numeric_limits<int64_t>::max();
        for (size_t d = 0; d < datasets.size(); ++d) {
          if (weights[d] > 0) {
            size = std::min<int64_t>(
                size, static_cast<int64_t>(static_cast<double>(datasets[d]->num_samples() - 1) / weights[d]));
          }
        }
      }
      *outputs[part] = std::make_shared<BlendedDataset>(datasets, weights, size);
    } else {
      std::vector<double> lengths;
      int64_t total = 0;
      for (const auto& dataset : datasets) {
        lengths.push_back(static_cast<double>(dataset->num_samples()));
        total += dataset->num_samples();
      }
      if (requested > total) {
        throw UserError(
            "--data-path without weights uses one epoch of each dataset: " + std::to_string(total) + " " +
            split_name + " samples, fewer than the " + std::to_string(requested) +
            " needed; give weights ('W1 PREFIX1 W2 PREFIX2') so datasets repeat, or lower --train-iters");
      }
      if (requested > 0) {
        *outputs[part] = std::make_shared<BlendedDataset>(datasets, lengths, requested);
      } else {
        *outputs[part] = BlendedDataset::exhaustive(datasets);
      }
    }
  }
  return result;
}

}  // namespace megatune::executor::data
