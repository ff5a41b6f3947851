// GradBufferLayout: Megatron's contiguous gradient buffer of one model chunk (param_and_grad_buffer): where
// each parameter's gradient lives and how the buffer splits into the buckets that are reduced over the
// data-parallel group, padded so a bucket divides evenly into dp shards for the distributed optimizer; how a
// model chunk's buffers are bucketed (BufferBucketing); and flat_range, the views into such flat buffers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend/tensor.h"
#include "layouts/grad_buffer_plan.h"
#include "layouts/op.h"
#include "layouts/parameter_table.h"

namespace megatune::executor {

class Backend;
class Communicator;

// One parameter as the grad buffer sees it.
struct GradBufferEntry {
  std::string name;
  std::int64_t numel = 0;
  // Buckets close only between entries of different groups: the planner's unit (layouts::stage_parameters:
  // the loss entry = final norm + output layer, one entry per decoder layer, the embedding entry). A
  // distinct group per entry gives Megatron's per-parameter rule.
  int group = 0;
  bool weight_decay = true;
  // Megatron's is_embedding_or_output_parameter (every copy of the word embedding, the output layer): the
  // group --decoupled-lr updates.
  bool embedding_or_output = false;
  // Replicated over TP (norms, row-parallel biases, the position table): every TP rank holds the same
  // gradient, so only tp rank 0 counts it in the global norm.
  bool tensor_parallel_duplicate = false;
  // A second copy of a parameter that another stage owns (a tied embedding on the last pipeline stage):
  // not counted in the global norm.
  bool shared = false;
};

struct GradBucketOptions {
  int data_parallel_size = 1;             // size of the group the buckets are reduced over (dp * cp)
  bool overlap_grad_reduce = false;       // buckets of bucket_size_elements; else one bucket
  std::int64_t bucket_size_elements = 0;  // 0: Megatron's max(40M, 1M * data_parallel_size)
  // Megatron pads each bucket's end to lcm(dp, 128) elements with the distributed optimizer (so that it
  // splits into equal, aligned shards); 0 picks that rule, 1 pads nothing.
  bool distributed_optimizer = false;
  std::int64_t bucket_end_multiple = 0;
};

// How a model chunk's flat buffers split into gradient buckets: Megatron's param_and_grad_buffer per region,
// the routed experts' (reduced over expert-dp) and the dense parameters' (over dp x cp). The default is one
// unpadded bucket per region.
struct BufferBucketing {
  GradBucketOptions dense, expert;
  bool shared_embedding = false;  // the chunk's word embedding is a tied copy that another stage owns
};

// A bucket: a range of the flat buffer and the entries in it (parameter_elements: layouts::grad_sync_buckets'
// bytes / 4 for the same model).
using GradBucketRange = layouts::GradBufferBucket;

class GradBufferLayout {
 public:
  static constexpr std::int64_t kAlignElements = 64;  // every parameter starts 64-element aligned

  // `entries` in buffer order (the reverse of the forward order: the backward fills the buffer front to
  // back). Buckets fill in that order and close after a group once they hold >= the bucket size.
  GradBufferLayout(std::vector<GradBufferEntry> entries, const GradBucketOptions& options);

  const std::vector<GradBufferEntry>& entries() const { return entries_; }
  int find(const std::string& name) const;  // entry index; throws std::out_of_range naming it
  std::int64_t offset(int entry) const { return offsets_.at(entry); }
  const std::vector<GradBucketRange>& buckets() const { return buckets_; }
  int bucket_of(int entry) const { return bucket_of_.at(entry); }
  std::int64_t total_elements() const { return total_elements_; }
  int data_parallel_size() const { return data_parallel_size_; }
  std::int64_t bucket_size_limit() const { return bucket_limit_; }
  // This dp rank's shard of bucket b (the distributed optimizer's ranges): numel / dp elements.
  std::int64_t shard_elements(int bucket) const;
  std::int64_t shard_begin(int bucket, int dp_rank) const;

 private:
  std::vector<GradBufferEntry> entries_;
  std::vector<std::int64_t> offsets_;
  std::vector<int> bucket_of_;
  std::vector<GradBucketRange> buckets_;
  std::int64_t total_elements_ = 0;
  std::int64_t bucket_limit_ = 0;
  int data_parallel_size_ = 1;
};

// A parameter of layouts' table as the grad buffer sees it: grouped like layouts::stage_parameters, with the
// TP-duplicate flag of Megatron's tensor_model_parallel attribute. `shared_embedding`: the chunk's word
// embedding is a tied copy that another stage owns.
GradBufferEntry grad_buffer_entry(const layouts::ParameterSpec& spec, bool shared_embedding);

// Throws std::invalid_argument (naming `who`) unless `layout` was laid out for the size of `group`.
void require_layout_for_group(const GradBufferLayout& layout, const Communicator& communicator,
                              layouts::CommGroup group, const char* who);

// A (rows, numel / rows) view of elements [begin, begin + numel) of a (1, n) flat buffer of `backend`
// (data-less in sizing mode); rows > 1 gives the row blocks the collectives split into.
Tensor flat_range(const Backend& backend, Tensor buffer, std::int64_t begin, std::int64_t numel,
                  std::int64_t rows = 1);

}  // namespace megatune::executor
