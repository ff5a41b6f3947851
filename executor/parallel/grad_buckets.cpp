// GradBufferLayout: aligned offsets, the bucket rule of layouts::grad_sync_buckets, bucket-end padding;
// grad_buffer_entry from layouts' parameter table.
#include "executor/parallel/grad_buckets.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <stdexcept>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

namespace {

std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

std::int64_t end_multiple(const GradBucketOptions& o) {
  if (o.bucket_end_multiple > 0) return o.bucket_end_multiple;
  return o.distributed_optimizer ? std::lcm<std::int64_t>(o.data_parallel_size, 128) : 1;
}

}  // namespace

GradBufferLayout::GradBufferLayout(std::vector<GradBufferEntry> entries, const GradBucketOptions& options)
    : entries_(std::move(entries)), data_parallel_size_(options.data_parallel_size) {
  if (options.data_parallel_size < 1) throw std::invalid_argument("GradBufferLayout: data-parallel size < 1");
  const std::int64_t pad = end_multiple(options);
  if (options.distributed_optimizer && pad % options.data_parallel_size != 0)
    throw std::invalid_argument("GradBufferLayout: bucket_end_multiple " + std::to_string(pad) +
                                " does not split into " + std::to_string(options.data_parallel_size) +
                                " shards");
  bucket_limit_ = options.bucket_size_elements > 0
                      ? options.bucket_size_elements
                      : std::max<std::int64_t>(40'000'000, 1'000'000LL * options.data_parallel_size);
  if (!options.overlap_grad_reduce) bucket_limit_ = INT64_MAX;
  const int n = static_cast<int>(entries_.size());
  offsets_.resize(n);
  bucket_of_.resize(n);
  std::int64_t cursor = 0;
  GradBucketRange bucket;
  for (int i = 0; i < n; ++i) {
    if (entries_[i].numel < 0)
      throw std::invalid_argument("GradBufferLayout: " + entries_[i].name + " numel < 0");
    offsets_[i] = cursor;
    cursor += round_up(entries_[i].numel, kAlignElements);
    bucket.parameter_elements += entries_[i].numel;
    bucket_of_[i] = static_cast<int>(buckets_.size());
    const bool group_ends = i + 1 == n || entries_[i + 1].group != entries_[i].group;
    if ((group_ends && bucket.parameter_elements >= bucket_limit_) || i + 1 == n) {
      bucket.end_entry = i + 1;
      bucket.end = cursor = round_up(cursor, pad);
      buckets_.push_back(bucket);
      bucket = GradBucketRange{cursor, cursor, 0, i + 1, i + 1};
    }
  }
  total_elements_ = cursor;
}

int GradBufferLayout::find(const std::string& name) const {
  for (int i = 0; i < static_cast<int>(entries_.size()); ++i)
    if (entries_[i].name == name) return i;
  throw std::out_of_range("no parameter named " + name + " in the gradient buffer");
}

std::int64_t GradBufferLayout::shard_elements(int bucket) const {
  return buckets_.at(bucket).numel() / data_parallel_size_;
}

std::int64_t GradBufferLayout::shard_begin(int bucket, int dp_rank) const {
  if (dp_rank < 0 || dp_rank >= data_parallel_size_)
    throw std::out_of_range("dp rank " + std::to_string(dp_rank) + " outside a group of " +
                            std::to_string(data_parallel_size_));
  return buckets_.at(bucket).begin + dp_rank * shard_elements(bucket);
}

GradBufferEntry grad_buffer_entry(const layouts::ParameterSpec& spec, bool shared_embedding) {
  GradBufferEntry e;
  e.name = spec.name;
  e.numel = spec.numel();
  e.group = spec.layer;  // layouts::StageParameters::layer_reverse's codes: the entry it belongs to
  e.weight_decay = spec.weight_decay;
  e.embedding_or_output = e.name == "embedding.word_embeddings.weight" || e.name == "output_layer.weight";
  // A routed expert is on its EP rank only, split over ETP: no other rank of its TP group holds a copy.
  e.tensor_parallel_duplicate = spec.split == layouts::TensorParallelSplit::kReplicated && spec.expert < 0;
  e.shared = shared_embedding && e.name == "embedding.word_embeddings.weight";
  return e;
}

void require_layout_for_group(const GradBufferLayout& layout, const Communicator& communicator,
                              layouts::CommGroup group, const char* who) {
  const int size = communicator.size(group);
  if (layout.data_parallel_size() != size)
    throw std::invalid_argument(std::string(who) + ": the grad buffer is laid out for " +
                                std::to_string(layout.data_parallel_size()) + " data-parallel ranks, group " +
                                layouts::comm_group_name(group) + " has " + std::to_string(size));
}

Tensor flat_range(const Backend& backend, Tensor buffer, std::int64_t begin, std::int64_t numel,
                  std::int64_t rows) {
  if (buffer.rows != 1 || begin < 0 || numel < 0 || begin + numel > buffer.cols || rows < 1 ||
      numel % rows != 0)
    throw std::out_of_range("flat_range: [" + std::to_string(begin) + ", " + std::to_string(begin + numel) +
                            ") in " + std::to_string(rows) + " rows of a (1, " + std::to_string(buffer.cols) +
                            ") buffer");
  Tensor v = buffer;
  if (buffer.data != nullptr)
    v.data = static_cast<char*>(buffer.data) + begin * backend.storage_bytes(buffer.dtype);
  v.rows = rows;
  v.cols = v.row_stride = numel / rows;
  return v;
}

}  // namespace megatune::executor
