// GradBufferLayout: aligned offsets, the bucket rule of layouts::grad_sync_buckets, bucket-end padding;
// grad_buffer_entry from layouts' parameter table.
#include "executor/parallel/grad_buckets.h"

#include <algorithm>
#include <stdexcept>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

namespace {

std::int64_t end_multiple(const GradBucketOptions& o) {
  if (o.bucket_end_multiple > 0) return o.bucket_end_multiple;
  return layouts::grad_bucket_end_multiple(o.data_parallel_size, o.distributed_optimizer);
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
  bucket_limit_ = layouts::grad_bucket_limit(options.bucket_size_elements, options.data_parallel_size,
                                             options.overlap_grad_reduce);
  std::vector<layouts::GradBufferItem> items;
  for (const GradBufferEntry& e : entries_) {
    if (e.numel < 0) throw std::invalid_argument("GradBufferLayout: " + e.name + " numel < 0");
    items.push_back({e.numel, e.group});
  }
  layouts::GradBufferPlan plan = layouts::plan_grad_buffer(items, bucket_limit_, pad);
  offsets_ = std::move(plan.offsets);
  bucket_of_ = std::move(plan.bucket_of);
  buckets_ = std::move(plan.buckets);
  total_elements_ = plan.total_elements;
}

int GradBufferLayout::find(const std::string& name) const {
  for (int i = 0; i < static_cast<int>(entries_.size()); ++i)
    if (entries_[i].name == name) return i;
  throw std::out_of_range("no parameter named " + name + " in the gradient buffer");
}

std::int64_t GradBufferLayout::shard_elements(int bucket) const {
  return layouts::grad_shard_elements(buckets_.at(bucket), data_parallel_size_);
}

std::int64_t GradBufferLayout::shard_begin(int bucket, int dp_rank) const {
  return layouts::grad_shard_begin(buckets_.at(bucket), data_parallel_size_, dp_rank);
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
