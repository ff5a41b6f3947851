// Zero-cost replay of all pp ranks' schedules with blocking, batched p2p semantics.
#include "layouts/schedule_replay.h"

#include <string>

namespace megatune::layouts {

namespace {

std::string describe(const ScheduleItem& item) {
  if (item.kind == ScheduleItemKind::kP2p) {
    RankSchedule one;
    one.items.push_back(item);
    return format_schedule(one);
  }
  std::string out(1, item.kind == ScheduleItemKind::kForward ? 'F' : 'B');
  out += std::to_string(item.microbatch);
  out += '.';
  out += std::to_string(item.chunk);
  return out;
}

}  // namespace

ReplayResult replay_schedules(const std::vector<RankSchedule>& schedules, const PipelineLayout& layout) {
  ReplayResult result;
  const int p = layout.pp();
  const int v = layout.vpp();
  const int num_stages = layout.num_stages();
  if (static_cast<int>(schedules.size()) != p) {
    result.error =
        "got " + std::to_string(schedules.size()) + " schedules for " + std::to_string(p) + " pp ranks";
    return result;
  }
  const int m = schedules.empty() ? 0 : schedules.front().num_microbatches;
  for (int r = 0; r < p; ++r) {
    if (schedules[r].pp_rank != r || schedules[r].num_microbatches != m || schedules[r].vpp != v) {
      result.error = "schedule " + std::to_string(r) + " does not belong to this layout";
      return result;
    }
  }
  result.forward_round.assign(num_stages, std::vector<int>(m, -1));
  result.backward_round.assign(num_stages, std::vector<int>(m, -1));
  std::vector<std::vector<char>> activation_arrived(num_stages, std::vector<char>(m, 0));
  std::vector<std::vector<char>> gradient_arrived(num_stages, std::vector<char>(m, 0));
  std::vector<size_t> pc(p, 0);
  std::vector<std::vector<char>> matched(p);  // per rank: matched flags of the current p2p group

  const auto fail = [&](const std::string& message) {
    result.ok = false;
    result.error = message;
    return result;
  };
  const auto current = [&](int r) -> const ScheduleItem* {
    return pc[r] < schedules[r].items.size() ? &schedules[r].items[pc[r]] : nullptr;
  };

  int round = 0;
  while (true) {
    bool progress = false;
    bool all_done = true;
    // 1. Run compute items until each rank blocks on a p2p group or finishes.
    for (int r = 0; r < p; ++r) {
      while (const ScheduleItem* item = current(r)) {
        if (item->kind == ScheduleItemKind::kP2p) break;
        const int s = item->stage_index;
        const int mb = item->microbatch;
        if (s < 0 || s >= num_stages || mb < 0 || mb >= m || s % p != r || s / p != item->chunk) {
          return fail("rank " + std::to_string(r) + " item " + describe(*item) +
                      " names a stage or microbatch outside the layout");
        }
        if (item->kind == ScheduleItemKind::kForward) {
          if (result.forward_round[s][mb] >= 0)
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) + " twice");
          if (s > 0 && result.forward_round[s - 1][mb] < 0) {
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) + " before stage " +
                        std::to_string(s - 1) + " forwarded it");
          }
          if (s > 0 && !activation_arrived[s][mb]) {
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) +
                        " before receiving its activation");
          }
          result.forward_round[s][mb] = round;
        } else {
          if (result.backward_round[s][mb] >= 0)
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) + " twice");
          if (result.forward_round[s][mb] < 0) {
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) + " before its forward");
          }
          if (s + 1 < num_stages && result.backward_round[s + 1][mb] < 0) {
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) + " before stage " +
                        std::to_string(s + 1) + " ran its backward");
          }
          if (s + 1 < num_stages && !gradient_arrived[s][mb]) {
            return fail("rank " + std::to_string(r) + " runs " + describe(*item) +
                        " before receiving its gradient");
          }
          result.backward_round[s][mb] = round;
        }
        ++pc[r];
        progress = true;
      }
      if (current(r)) {
        all_done = false;
        if (matched[r].size() != current(r)->transfers.size())
          matched[r].assign(current(r)->transfers.size(), 0);
      }
    }
    if (all_done) break;
    // 2. Pair transfers between the current groups.
    for (int r = 0; r < p; ++r) {
      const ScheduleItem* item = current(r);
      if (!item) continue;
      for (size_t i = 0; i < item->transfers.size(); ++i) {
        if (matched[r][i]) continue;
        const P2pTransfer& t = item->transfers[i];
        const int q = t.peer_pp_rank;
        if (q < 0 || q >= p)
          return fail("rank " + std::to_string(r) + " addresses pp rank " + std::to_string(q));
        const ScheduleItem* other = current(q);
        if (!other || other->kind != ScheduleItemKind::kP2p) continue;
        for (size_t j = 0; j < other->transfers.size(); ++j) {
          const P2pTransfer& u = other->transfers[j];
          if (matched[q][j] || u.peer_pp_rank != r || u.tensor != t.tensor || u.direction == t.direction)
            continue;
          if (u.microbatch != t.microbatch || u.chunk != t.peer_chunk || u.peer_chunk != t.chunk) {
            return fail("rank " + std::to_string(r) + " " + describe(*item) + " meets rank " +
                        std::to_string(q) + " " + describe(*other) + " with a different microbatch or chunk");
          }
          matched[r][i] = 1;
          matched[q][j] = 1;
          const P2pTransfer& recv = t.direction == P2pDirection::kRecv ? t : u;
          const int receiver = t.direction == P2pDirection::kRecv ? r : q;
          const int stage = recv.chunk * p + receiver;
          if (stage >= num_stages || recv.microbatch < 0 || recv.microbatch >= m) {
            return fail("rank " + std::to_string(receiver) +
                        " receives for a stage or microbatch outside the layout");
          }
          auto& arrived = recv.tensor == P2pTensor::kActivation ? activation_arrived : gradient_arrived;
          if (arrived[stage][recv.microbatch]) {
            return fail("rank " + std::to_string(receiver) +
                        " receives the same tensor twice: " + describe(*item));
          }
          arrived[stage][recv.microbatch] = 1;
          break;
        }
      }
    }
    // 3. Complete groups whose transfers all met their peers.
    for (int r = 0; r < p; ++r) {
      const ScheduleItem* item = current(r);
      if (!item || item->kind != ScheduleItemKind::kP2p) continue;
      bool complete = true;
      for (char flag : matched[r]) complete = complete && flag;
      if (complete) {
        ++pc[r];
        matched[r].clear();
        progress = true;
      }
    }
    ++round;
    if (!progress) {
      std::string message = "deadlock after " + std::to_string(round) + " rounds:";
      for (int r = 0; r < p; ++r) {
        message += " rank " + std::to_string(r) + " at " +
                   (current(r) ? describe(*current(r)) : std::string("end")) + ";";
      }
      return fail(message);
    }
  }
  for (int s = 0; s < num_stages; ++s) {
    for (int mb = 0; mb < m; ++mb) {
      const bool backward_missing = !schedules.front().forward_only && result.backward_round[s][mb] < 0;
      if (result.forward_round[s][mb] < 0 || backward_missing) {
        return fail("stage " + std::to_string(s) + " never ran forward and backward of microbatch " +
                    std::to_string(mb));
      }
    }
  }
  result.ok = true;
  result.rounds = round;
  return result;
}

}  // namespace megatune::layouts
