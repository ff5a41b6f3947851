// The traced-run format's shared pieces: file names and the op fields of an op line.
#include "layouts/run_trace_format.h"

#include <string>

#include "base/json_quote.h"

namespace megatune::layouts {

std::string run_trace_rank_file(int rank) { return "rank_" + std::to_string(rank) + ".ops.jsonl"; }

void write_op_trace_fields(std::ostream& out, const Op& op) {
  static const char* dtype_names[] = {"bf16", "fp16", "fp32", "fp8"};
  const AttentionShape& a = op.attention;
  out << "\"kind\":" << base::json_quote(op_kind_name(op.kind))
      << ",\"phase\":" << base::json_quote(op_phase_name(op.phase)) << ",\"dtype\":\""
      << dtype_names[static_cast<int>(op.dtype)] << "\",\"label\":" << base::json_quote(op.label)
      << ",\"layer\":" << op.layer << ",\"microbatch\":" << op.microbatch << ",\"chunk\":" << op.chunk
      << ",\"m\":" << op.m << ",\"n\":" << op.n << ",\"k\":" << op.k
      << ",\"accumulate\":" << (op.accumulate ? "true" : "false") << ",\"bytes\":" << op.bytes
      << ",\"group\":" << base::json_quote(comm_group_name(op.group)) << ",\"group_size\":" << op.group_size
      << ",\"peer\":" << op.peer_rank << ",\"attention\":[" << a.batch << ',' << a.heads << ',' << a.kv_heads
      << ',' << a.seq_q << ',' << a.seq_kv << ',' << a.head_dim << ',' << (a.causal ? 1 : 0) << ','
      << a.value_head_dim() << ']';
}

}  // namespace megatune::layouts
