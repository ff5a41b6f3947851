// ParameterLayout: the list of the model's parameters and their aligned offsets in the flat buffers.
#include "executor/model/parameter_layout.h"

#include <algorithm>
#include <stdexcept>

namespace megatune::executor {

std::string layer_parameter(int layer, const char* suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

namespace {

// The region's entries in buffer order, with the index of each in `forward`.
std::vector<GradBufferEntry> region_entries(const std::vector<ParameterEntry>& forward, bool shared_embedding,
                                            bool experts, std::vector<std::size_t>* indices = nullptr) {
  std::vector<GradBufferEntry> out;
  for (std::size_t i = forward.size(); i-- > 0;) {
    if ((forward[i].expert >= 0) != experts) continue;
    out.push_back(grad_buffer_entry(forward[i], shared_embedding));
    if (indices != nullptr) indices->push_back(i);
  }
  return out;
}

}  // namespace

ParameterLayout::ParameterLayout(const TransformerConfig& c, const StageSpan& stage,
                                 const BufferBucketing& bucketing) {
  for (layouts::ParameterSpec& spec : layouts::stage_parameter_table(rank_shape(c), stage)) {
    ParameterEntry e;
    static_cast<layouts::ParameterSpec&>(e) = std::move(spec);
    entries_.push_back(std::move(e));
  }
  // Megatron keeps expert parameters in a buffer of their own (reduced over expert-dp): here the front of
  // the flat buffers, each region in reverse forward order and bucketed by its own rule.
  for (const bool expert : {true, false}) {
    std::vector<std::size_t> indices;
    GradBufferLayout region(region_entries(entries_, bucketing.shared_embedding, expert, &indices),
                            expert ? bucketing.expert : bucketing.dense);
    for (std::size_t i = 0; i < indices.size(); ++i)
      entries_[indices[i]].offset = total_elements_ + region.offset(static_cast<int>(i));
    total_elements_ += region.total_elements();
    if (!expert) {
      dense_buffer_.emplace(std::move(region));
    } else if (!indices.empty()) {
      expert_elements_ = total_elements_;
      expert_buffer_.emplace(std::move(region));
    }
  }
}

std::vector<GradBufferEntry> grad_buffer_entries(const ParameterLayout& layout, bool shared_embedding,
                                                 bool experts) {
  return region_entries(layout.entries(), shared_embedding, experts);
}

std::vector<float> tensor_parallel_slice(const ParameterEntry& e, const std::vector<float>& global,
                                         int tp_rank, int tp_size) {
  const std::int64_t grows = e.global_rows(), gcols = e.global_cols();
  if (static_cast<std::int64_t>(global.size()) != grows * gcols)
    throw std::invalid_argument("tensor_parallel_slice: " + e.name + " has the wrong element count");
  if (e.split == TensorParallelSplit::kReplicated || tp_size == 1) return global;
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(e.numel()));
  if (e.split == TensorParallelSplit::kRows) {
    std::int64_t part_start = 0;
    for (std::int64_t part : e.global_parts) {
      const std::int64_t share = part / tp_size, first = part_start + tp_rank * share;
      out.insert(out.end(), global.begin() + first * gcols, global.begin() + (first + share) * gcols);
      part_start += part;
    }
  } else {
    for (std::int64_t r = 0; r < grows; ++r) {
      std::int64_t part_start = 0;
      for (std::int64_t part : e.global_parts) {
        const std::int64_t share = part / tp_size, first = part_start + tp_rank * share;
        out.insert(out.end(), global.begin() + r * gcols + first, global.begin() + r * gcols + first + share);
        part_start += part;
      }
    }
  }
  if (static_cast<std::int64_t>(out.size()) != e.numel())
    throw std::logic_error("tensor_parallel_slice: " + e.name + " slice does not match its shard shape");
  return out;
}

std::vector<float> tensor_parallel_assemble(const ParameterEntry& e,
                                            const std::vector<std::vector<float>>& slices) {
  const std::int64_t tp = static_cast<std::int64_t>(slices.size());
  if (tp == 0) throw std::invalid_argument("tensor_parallel_assemble: no slices of " + e.name);
  const std::int64_t grows = e.global_rows(), gcols = e.global_cols();
  if (e.split == TensorParallelSplit::kReplicated || tp == 1) return slices.front();
  std::vector<float> global(static_cast<std::size_t>(grows * gcols));
  for (std::int64_t r = 0; r < tp; ++r) {
    const std::vector<float>& slice = slices[r];
    std::int64_t at = 0;  // position in the slice
    auto take = [&](std::int64_t global_index, std::int64_t n) {
      if (at + n > static_cast<std::int64_t>(slice.size()))
        throw std::invalid_argument("tensor_parallel_assemble: slice of " + e.name + " is too short");
      std::copy(slice.begin() + at, slice.begin() + at + n, global.begin() + global_index);
      at += n;
    };
    if (e.split == TensorParallelSplit::kRows) {
      std::int64_t part_start = 0;
      for (std::int64_t part : e.global_parts) {
        const std::int64_t share = part / tp;
        take((part_start + r * share) * gcols, share * gcols);
        part_start += part;
      }
    } else {
      for (std::int64_t row = 0; row < grows; ++row) {
        std::int64_t part_start = 0;
        for (std::int64_t part : e.global_parts) {
          const std::int64_t share = part / tp;
          take(row * gcols + part_start + r * share, share);
          part_start += part;
        }
      }
    }
    if (at != static_cast<std::int64_t>(slice.size()))
      throw std::invalid_argument("tensor_parallel_assemble: slice of " + e.name + " has the wrong size");
  }
  return global;
}

const ParameterEntry& ParameterLayout::find(const std::string& name) const {
  for (const ParameterEntry& e : entries_)
    if (e.name == name) return e;
  throw std::out_of_range("no parameter named " + name);
}

std::int64_t ParameterLayout::parameter_count() const {
  std::int64_t n = 0;
  for (const ParameterEntry& e : entries_) n += e.numel();
  return n;
}

}  // namespace megatune::executor
