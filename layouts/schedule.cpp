// Pipeline schedules in Megatron's order: forward_backward_no_pipelining,
// forward_backward_pipelining_without_interleaving and ..._with_interleaving (non-overlapped p2p path).
#include "layouts/schedule.h"

#include <algorithm>
#include <string>

#include "base/user_error.h"

namespace megatune::layouts {

std::string_view to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kNoPipelining:
      return "no-pipelining";
    case ScheduleKind::kOneForwardOneBackward:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved-1f1b";
  }
  return "?";
}

std::vector<VirtualMicrobatch> interleaved_schedule_table(int num_microbatches, int vpp, int group_size) {
  std::vector<VirtualMicrobatch> table;
  if (num_microbatches <= 0 || vpp <= 0 || group_size <= 0) return table;
  table.reserve(static_cast<size_t>(num_microbatches) * vpp);
  for (int group_start = 0; group_start < num_microbatches; group_start += group_size) {
    const int group_end = std::min(group_start + group_size, num_microbatches);
    for (int chunk = 0; chunk < vpp; ++chunk) {
      for (int mb = group_start; mb < group_end; ++mb) table.push_back({mb, chunk});
    }
  }
  return table;
}

VirtualMicrobatch interleaved_schedule_entry(int k, int num_microbatches, int vpp, int group_size) {
  const int64_t full_group = int64_t{group_size} * vpp;  // entries of a group of group_size microbatches
  const int64_t group_start = k / full_group * group_size;
  const int64_t size =
      std::min<int64_t>(group_size, num_microbatches - group_start);  // the last may be short
  const int64_t within = k - group_start * vpp;
  return {static_cast<int>(group_start + within % size), static_cast<int>(within / size)};
}

int warmup_forward_count(int pp, int pp_rank, int vpp, int num_microbatches, int group_size) {
  if (pp <= 1) return 0;
  const int total = num_microbatches * vpp;
  if (vpp <= 1) return std::min(pp - pp_rank - 1, total);
  return std::min(2 * (pp - pp_rank - 1) + (vpp - 1) * group_size, total);
}

namespace {

// Builds one rank's items; keeps per-chunk counts of received tensors so each receive knows which
// (microbatch, chunk) it carries (Megatron indexes received activations by microbatch id and pops
// gradients in order, so the j-th receive for a chunk belongs to microbatch j).
class RankScheduleBuilder {
 public:
  RankScheduleBuilder(RankSchedule& schedule, int pp, int vpp, int pp_rank)
      : s_(schedule),
        p_(pp),
        v_(vpp),
        r_(pp_rank),
        activations_received_(vpp, 0),
        gradients_received_(vpp, 0) {}

  void forward(int mb, int chunk) { compute(ScheduleItemKind::kForward, mb, chunk); }
  void backward(int mb, int chunk) { compute(ScheduleItemKind::kBackward, mb, chunk); }

  bool is_vp_first_stage(int chunk) const { return r_ == 0 && chunk == 0; }
  bool is_vp_last_stage(int chunk) const { return r_ == p_ - 1 && chunk == v_ - 1; }

  // Transfers; a group is emitted by flush() (nothing when empty, like Megatron's calls with None tensors).
  void send_activation(int mb, int chunk) {
    if (is_vp_last_stage(chunk)) return;
    const int peer = (r_ + 1) % p_;
    group_.push_back(
        {P2pDirection::kSend, P2pTensor::kActivation, peer, mb, chunk, r_ == p_ - 1 ? chunk + 1 : chunk});
  }
  void send_gradient(int mb, int chunk) {
    if (is_vp_first_stage(chunk)) return;
    const int peer = (r_ + p_ - 1) % p_;
    group_.push_back(
        {P2pDirection::kSend, P2pTensor::kGradient, peer, mb, chunk, r_ == 0 ? chunk - 1 : chunk});
  }
  void recv_activation(int chunk) {
    if (is_vp_first_stage(chunk)) return;
    const int peer = (r_ + p_ - 1) % p_;
    const int mb = activations_received_[chunk]++;
    group_.push_back(
        {P2pDirection::kRecv, P2pTensor::kActivation, peer, mb, chunk, r_ == 0 ? chunk - 1 : chunk});
  }
  void recv_gradient(int chunk) {
    if (is_vp_last_stage(chunk)) return;
    const int peer = (r_ + 1) % p_;
    const int mb = gradients_received_[chunk]++;
    group_.push_back(
        {P2pDirection::kRecv, P2pTensor::kGradient, peer, mb, chunk, r_ == p_ - 1 ? chunk + 1 : chunk});
  }
  void flush() {
    if (group_.empty()) return;
    ScheduleItem item;
    item.kind = ScheduleItemKind::kP2p;
    item.transfers = std::move(group_);
    group_.clear();
    s_.items.push_back(std::move(item));
  }

 private:
  void compute(ScheduleItemKind kind, int mb, int chunk) {
    flush();
    ScheduleItem item;
    item.kind = kind;
    item.microbatch = mb;
    item.chunk = chunk;
    item.stage_index = chunk * p_ + r_;
    s_.items.push_back(item);
  }

  RankSchedule& s_;
  int p_, v_, r_;
  std::vector<int> activations_received_;
  std::vector<int> gradients_received_;
  std::vector<P2pTransfer> group_;
};

void build_no_pipelining(RankSchedule& s) {
  RankScheduleBuilder b(s, 1, 1, 0);
  for (int mb = 0; mb < s.num_microbatches; ++mb) {
    b.forward(mb, 0);
    if (!s.forward_only) b.backward(mb, 0);
  }
}

void build_one_f_one_b(RankSchedule& s) {
  const int p = s.pp, r = s.pp_rank, m = s.num_microbatches;
  RankScheduleBuilder b(s, p, 1, r);
  const int warmup = s.forward_only ? m : std::min(p - r - 1, m);  // forward_only: all of them
  const int remaining = m - warmup;
  s.num_warmup_forwards = warmup;
  s.all_forwards_in_warmup = remaining == 0;
  for (int i = 0; i < warmup; ++i) {
    b.recv_activation(0);  // recv_forward
    b.flush();
    b.forward(i, 0);
    b.send_activation(i, 0);  // send_forward
    b.flush();
  }
  if (remaining > 0) {
    b.recv_activation(0);  // recv_forward
    b.flush();
  }
  for (int i = 0; i < remaining; ++i) {
    const bool last_iteration = i == remaining - 1;
    b.forward(i + warmup, 0);
    b.send_activation(i + warmup, 0);  // send_forward_recv_backward
    b.recv_gradient(0);
    b.flush();
    b.backward(i, 0);
    b.send_gradient(i, 0);  // send_backward or send_backward_recv_forward
    if (!last_iteration) b.recv_activation(0);
    b.flush();
  }
  for (int i = 0; i < warmup && !s.forward_only; ++i) {
    b.recv_gradient(0);  // recv_backward
    b.flush();
    b.backward(remaining + i, 0);
    b.send_gradient(remaining + i, 0);  // send_backward
    b.flush();
  }
}

void build_interleaved(RankSchedule& s) {
  const int p = s.pp, v = s.vpp, r = s.pp_rank, m = s.num_microbatches, g = s.microbatch_group_size;
  RankScheduleBuilder b(s, p, v, r);
  const std::vector<VirtualMicrobatch> table = interleaved_schedule_table(m, v, g);
  const int total = m * v;
  const auto chunk_of = [&](int k, bool forward) {
    const int chunk = table[k % total].chunk;
    return forward ? chunk : v - 1 - chunk;
  };
  const auto microbatch_of = [&](int k) { return table[k % total].microbatch; };
  // Megatron's recv_tensor_from_previous_stage: whether a tensor arrives for iteration k + 1 and its chunk.
  const auto recv_from_previous_stage = [&](int k, bool forward, int& next_chunk) {
    const bool leading = forward ? r == 0 : r == p - 1;
    const int last_chunk = forward ? v - 1 : 0;
    if (!leading) {
      next_chunk = chunk_of(k + 1, forward);
      return true;
    }
    bool recv = true;
    if (k < p - 1) {
      recv = false;
      next_chunk = chunk_of(k + 1, forward);
    } else {
      next_chunk = chunk_of(k - (p - 1), forward);
    }
    if (next_chunk == last_chunk) recv = false;
    next_chunk += forward ? 1 : -1;
    return recv;
  };

  const int warmup = s.forward_only ? total : std::min(2 * (p - r - 1) + (v - 1) * g, total);
  const bool all_warmup = warmup >= total;
  const int remaining = total - warmup;
  s.num_warmup_forwards = warmup;
  s.all_forwards_in_warmup = all_warmup;

  b.recv_activation(0);  // recv_forward(is_vp_first_stage(0))
  b.flush();
  for (int k = 0; k < warmup; ++k) {
    const int chunk = chunk_of(k, true);
    b.forward(microbatch_of(k), chunk);
    int next_chunk = 0;
    bool recv_prev = recv_from_previous_stage(k, true, next_chunk);
    if (k == total - 1) recv_prev = false;
    b.send_activation(microbatch_of(k), chunk);
    if (recv_prev) b.recv_activation(next_chunk);
    if (k == warmup - 1 && !all_warmup && r != p - 1) b.recv_gradient(v - 1);
    b.flush();
  }
  for (int k = 0; k < remaining; ++k) {
    const int forward_k = k + warmup;
    const int backward_k = k;
    const int forward_chunk = chunk_of(forward_k, true);
    const int backward_chunk = chunk_of(backward_k, false);
    b.forward(microbatch_of(forward_k), forward_chunk);
    b.backward(microbatch_of(backward_k), backward_chunk);
    int next_forward_chunk = 0, next_backward_chunk = 0;
    bool recv_prev = recv_from_previous_stage(forward_k, true, next_forward_chunk);
    const bool recv_next = recv_from_previous_stage(backward_k, false, next_backward_chunk);
    if (k == remaining - 1) recv_prev = false;
    b.send_activation(microbatch_of(forward_k), forward_chunk);
    b.send_gradient(microbatch_of(backward_k), backward_chunk);
    if (recv_prev) b.recv_activation(next_forward_chunk);
    if (recv_next) b.recv_gradient(next_backward_chunk);
    b.flush();
  }
  if (s.forward_only) return;
  if (all_warmup) {
    b.recv_gradient(v - 1);  // recv_backward(is_vp_last_stage(v - 1))
    b.flush();
  }
  for (int k = remaining; k < total; ++k) {
    const int chunk = chunk_of(k, false);
    b.backward(microbatch_of(k), chunk);
    int next_chunk = 0;
    bool recv_next = recv_from_previous_stage(k, false, next_chunk);
    if (k == total - 1) recv_next = false;
    b.send_gradient(microbatch_of(k), chunk);
    if (recv_next) b.recv_gradient(next_chunk);
    b.flush();
  }
}

void check_schedule_request(const RankSchedule& s) {
  if (s.pp < 1 || s.vpp < 1) throw UserError("pipeline layout is empty: give at least one stage");
  if (s.pp_rank < 0 || s.pp_rank >= s.pp) {
    throw UserError("pipeline rank " + std::to_string(s.pp_rank) +
                    " is outside --pipeline-model-parallel-size " + std::to_string(s.pp));
  }
  if (s.num_microbatches < 1) {
    throw UserError("the schedule needs at least one microbatch: raise --global-batch-size");
  }
  if (int64_t{s.num_microbatches} * s.vpp > 100'000'000) {
    throw UserError(
        std::to_string(s.num_microbatches) + " microbatches x " + std::to_string(s.vpp) +
        " chunks is too many schedule steps: lower --global-batch-size or raise --micro-batch-size");
  }
  if (s.pp == 1 && s.vpp > 1) {
    throw UserError(
        "virtual pipeline stages need --pipeline-model-parallel-size > 1 (Megatron's no-pipelining "
        "schedule does not support model chunks): use one stage per rank or raise pp");
  }
}

void check_interleaving(const RankSchedule& s) {
  const int g = s.microbatch_group_size, num_microbatches = s.num_microbatches;
  if (g < s.pp || g > num_microbatches) {
    throw UserError("--microbatch-group-size-per-virtual-pipeline-stage " + std::to_string(g) +
                    " must lie in [pp = " + std::to_string(s.pp) + ", microbatches = " +
                    std::to_string(num_microbatches) + "]: adjust it or the global batch size");
  }
  if (num_microbatches % g != 0 && num_microbatches % g < s.pp) {
    throw UserError(std::to_string(num_microbatches) + " microbatches leave a last group of " +
                    std::to_string(num_microbatches % g) + " < pp = " + std::to_string(s.pp) +
                    " for microbatch group size " + std::to_string(g) +
                    ": make the microbatch count a multiple of the group size or leave a remainder >= pp");
  }
}

RankSchedule schedule_header(const PipelineLayout& layout, int num_microbatches, int group_size,
                             int pp_rank) {
  RankSchedule s;
  s.pp = layout.pp();
  s.vpp = layout.vpp();
  s.pp_rank = pp_rank;
  s.num_microbatches = num_microbatches;
  check_schedule_request(s);
  s.kind = s.pp == 1    ? ScheduleKind::kNoPipelining
           : s.vpp == 1 ? ScheduleKind::kOneForwardOneBackward
                        : ScheduleKind::kInterleaved;
  if (s.kind == ScheduleKind::kInterleaved) {
    s.microbatch_group_size = group_size > 0 ? group_size : s.pp;
    check_interleaving(s);
  }
  return s;
}

}  // namespace

RankSchedule build_rank_schedule(const PipelineLayout& layout, int num_microbatches, int group_size,
                                 int pp_rank, bool forward_only) {
  RankSchedule s = schedule_header(layout, num_microbatches, group_size, pp_rank);
  s.forward_only = forward_only;
  switch (s.kind) {
    case ScheduleKind::kNoPipelining:
      build_no_pipelining(s);
      break;
    case ScheduleKind::kOneForwardOneBackward:
      build_one_f_one_b(s);
      break;
    case ScheduleKind::kInterleaved:
      build_interleaved(s);
      break;
  }
  return s;
}

RankSchedule build_schedule(const ModelSpec& model, const ParallelConfig& config, int pp_rank,
                            bool forward_only) {
  return build_rank_schedule(config.resolved_pipeline_layout(model), config.num_microbatches(),
                             config.micro_batch_group_size(), pp_rank, forward_only);
}

std::vector<RankSchedule> build_all_schedules(const ModelSpec& model, const ParallelConfig& config) {
  const PipelineLayout layout = config.resolved_pipeline_layout(model);
  std::vector<RankSchedule> out;
  for (int r = 0; r < layout.pp(); ++r) {
    out.push_back(build_rank_schedule(layout, config.num_microbatches(), config.micro_batch_group_size(), r));
  }
  return out;
}

int max_in_flight_microbatches(const RankSchedule& schedule) {
  int in_flight = 0, peak = 0;
  for (const ScheduleItem& item : schedule.items) {
    if (item.kind == ScheduleItemKind::kForward) peak = std::max(peak, ++in_flight);
    if (item.kind == ScheduleItemKind::kBackward) --in_flight;
  }
  return peak;
}

std::string format_transfer(P2pDirection direction, P2pTensor tensor, int microbatch, int chunk,
                            const std::string& peer) {
  std::string out;
  out += direction == P2pDirection::kSend ? '+' : '-';
  out += tensor == P2pTensor::kActivation ? 'a' : 'g';
  return out + std::to_string(microbatch) + "." + std::to_string(chunk) + "@" + peer;
}

std::string format_schedule(const RankSchedule& schedule, bool include_p2p) {
  std::string out;
  const auto separate = [&] {
    if (!out.empty()) out += ' ';
  };
  for (const ScheduleItem& item : schedule.items) {
    if (item.kind == ScheduleItemKind::kP2p) {
      if (!include_p2p) continue;
      separate();
      out += '[';
      for (size_t i = 0; i < item.transfers.size(); ++i) {
        const P2pTransfer& t = item.transfers[i];
        if (i > 0) out += ' ';
        out += format_transfer(t.direction, t.tensor, t.microbatch, t.chunk, std::to_string(t.peer_pp_rank));
      }
      out += ']';
      continue;
    }
    separate();
    out += item.kind == ScheduleItemKind::kForward ? 'F' : 'B';
    out += std::to_string(item.microbatch) + "." + std::to_string(item.chunk);
  }
  return out;
}

}  // namespace megatune::layouts
