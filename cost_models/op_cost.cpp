// Names of provenances, collectives and dtypes; nccl-tests bus factors; collective groups from rank lists.
#include "cost_models/op_cost.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "base/user_error.h"

namespace megatune::cost_models {

const char* provenance_name(Provenance provenance) {
  switch (provenance) {
    case Provenance::kMeasured:
      return "measured";
    case Provenance::kInterpolated:
      return "interpolated";
    case Provenance::kFitted:
      return "fitted";
    case Provenance::kTransferred:
      return "transferred";
    case Provenance::kAnalytic:
      return "analytic";
  }
  return "?";
}

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
    case CollectiveOp::kSendRecv:
      return "send_recv";
    case CollectiveOp::kBroadcast:
      return "broadcast";
  }
  return "?";
}

CollectiveOp parse_collective_op(const std::string& name) {
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
                          CollectiveOp::kAllToAll, CollectiveOp::kSendRecv, CollectiveOp::kBroadcast}) {
    if (name == collective_op_name(op)) return op;
  }
  throw UserError("unknown collective \"" + name +
                  "\"; use all_reduce, all_gather, reduce_scatter, all_to_all, send_recv or broadcast");
}

CollectiveOp collective_op_of(layouts::OpKind kind) {
  switch (kind) {
    case layouts::OpKind::kAllReduce:
      return CollectiveOp::kAllReduce;
    case layouts::OpKind::kAllGather:
      return CollectiveOp::kAllGather;
    case layouts::OpKind::kReduceScatter:
      return CollectiveOp::kReduceScatter;
    case layouts::OpKind::kAllToAll:
      return CollectiveOp::kAllToAll;
    case layouts::OpKind::kSend:
    case layouts::OpKind::kRecv:
      return CollectiveOp::kSendRecv;
    case layouts::OpKind::kBroadcast:
      return CollectiveOp::kBroadcast;
    default:
      throw std::invalid_argument(std::string("op kind ") + layouts::op_kind_name(kind) +
                                  " is not a collective");
  }
}

double bus_factor(CollectiveOp op, int group_size) {
  const double n = std::max(group_size, 1);
  switch (op) {
    case CollectiveOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return (n - 1) / n;
    case CollectiveOp::kSendRecv:
    case CollectiveOp::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

CollectiveGroup collective_group_of(const std::vector<int>& global_ranks, int gpus_per_node) {
  if (gpus_per_node <= 0) throw std::invalid_argument("collective_group_of: gpus_per_node must be positive");
  std::set<int> nodes;
  for (const int rank : global_ranks) nodes.insert(rank / gpus_per_node);
  CollectiveGroup group;
  group.size = static_cast<int>(global_ranks.size());
  group.nodes = std::max<int>(1, static_cast<int>(nodes.size()));
  return group;
}

const char* dtype_name(layouts::DType dtype) {
  switch (dtype) {
    case layouts::DType::kBF16:
      return "bf16";
    case layouts::DType::kFP16:
      return "fp16";
    case layouts::DType::kFP32:
      return "fp32";
    case layouts::DType::kFP8:
      return "fp8";
  }
  return "?";
}

layouts::DType parse_dtype(const std::string& name) {
  std::string lower;
  for (const char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "bf16") return layouts::DType::kBF16;
  if (lower == "fp16") return layouts::DType::kFP16;
  if (lower == "fp32" || lower == "tf32") return layouts::DType::kFP32;
  if (lower == "fp8") return layouts::DType::kFP8;
  throw UserError("unknown dtype \"" + name + "\"; use bf16, fp16, fp32 or fp8");
}

}  // namespace megatune::cost_models
