// Profiling session: resumption filter and sweep execution into the cost database.
#include "profiler/profile_session.h"

#include "cost_models/record_store.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler {
namespace {

template <typename Row>
bool measured_with(const Row& row, const DeviceIdentity& identity) {
  return row.gpu == identity.gpu && row.versions == identity.versions;
}

template <typename Item>
void keep_pending(const std::vector<Item>& items, const std::vector<cost_models::KernelTiming>& have,
                  std::vector<Item>& out) {
  for (const Item& item : items) {
    const cost_models::KernelTiming key = kernel_timing_key(item);
    bool found = false;
    for (const cost_models::KernelTiming& row : have) {
      if (same_kernel_key(row, key)) {
        found = true;
        break;
      }
    }
    if (!found) out.push_back(item);
  }
}

template <typename Row>
void fill_timing(Row& row, const DeviceIdentity& identity, const TimingSummary& summary) {
  row.gpu = identity.gpu;
  row.versions = identity.versions;
  row.median_s = summary.median_s;
  row.min_s = summary.min_s;
  row.max_s = summary.max_s;
  row.repeats = summary.repeats;
  row.measured_at = cost_models::utc_now_iso8601();
}

}  // namespace

Sweep pending_items(cost_models::Database& database, const Sweep& sweep, const DeviceIdentity& identity) {
  std::vector<cost_models::KernelTiming> kernels;
  for (cost_models::KernelTiming& row : cost_models::load_kernel_timings(database, identity.gpu)) {
    if (measured_with(row, identity)) kernels.push_back(std::move(row));
  }
  std::vector<cost_models::CollectiveTiming> collectives;
  for (cost_models::CollectiveTiming& row : cost_models::load_collective_timings(database, identity.gpu)) {
    if (measured_with(row, identity)) collectives.push_back(std::move(row));
  }
  Sweep pending;
  keep_pending(sweep.gemms, kernels, pending.gemms);
  keep_pending(sweep.attention, kernels, pending.attention);
  keep_pending(sweep.memory_bound, kernels, pending.memory_bound);
  for (const CollectiveItem& item : sweep.collectives) {
    const cost_models::CollectiveTiming key = collective_timing_key(item);
    bool found = false;
    for (const cost_models::CollectiveTiming& row : collectives) {
      if (same_collective_key(row, key)) {
        found = true;
        break;
      }
    }
    if (!found) pending.collectives.push_back(item);
  }
  return pending;
}

ProfileCounts run_kernel_sweep(cost_models::Database& database, KernelRunner& runner, const Sweep& sweep,
                               const DeviceIdentity& identity, const RepeatPolicy& policy,
                               const ProgressCallback& progress, int worker_index, int worker_count) {
  ProfileCounts counts;
  const std::size_t total = sweep.kernel_count();
  std::size_t mine_total = 0;
  for (std::size_t i = 0; i < total; ++i) mine_total += static_cast<int>(i % worker_count) == worker_index;
  std::size_t position = 0;
  std::size_t done = 0;
  auto handle = [&](const auto& item, const TimingSamples& samples) {
    if (samples) {
      cost_models::KernelTiming row = kernel_timing_key(item);
      fill_timing(row, identity, summarize(*samples));
      cost_models::Transaction transaction(database);
      cost_models::upsert_kernel_timing(database, row);
      transaction.commit();
      ++counts.measured;
    } else {
      ++counts.unsupported;
    }
    ++done;
    if (progress) progress({done, mine_total, describe(item)});
  };
  auto mine = [&]() { return static_cast<int>(position++ % worker_count) == worker_index; };
  for (const GemmItem& item : sweep.gemms) {
    if (mine()) handle(item, runner.time_gemm(item, policy));
  }
  for (const MemoryBoundItem& item : sweep.memory_bound) {
    if (mine()) handle(item, runner.time_memory_bound(item, policy));
  }
  for (const AttentionItem& item : sweep.attention) {
    if (mine()) handle(item, runner.time_attention(item, policy));
  }
  return counts;
}

ProfileCounts run_collective_sweep(cost_models::Database* database, CollectiveRunner& runner,
                                   const std::vector<CollectiveItem>& items, const DeviceIdentity& identity,
                                   const RepeatPolicy& policy, const ProgressCallback& progress) {
  ProfileCounts counts;
  std::size_t done = 0;
  for (const CollectiveItem& item : items) {
    if (item.group_size > runner.world_size()) {
      ++counts.unsupported;
    } else {
      const TimingSamples samples = runner.time_collective(item, policy);
      if (runner.rank() == 0) {
        if (samples && database != nullptr) {
          cost_models::CollectiveTiming row = collective_timing_key(item);
          row.interconnect = identity.interconnect;
          fill_timing(row, identity, summarize(*samples));
          cost_models::Transaction transaction(*database);
          cost_models::upsert_collective_timing(*database, row);
          transaction.commit();
          ++counts.measured;
        } else if (!samples) {
          ++counts.unsupported;
        }
      }
    }
    ++done;
    if (progress) progress({done, items.size(), describe(item)});
  }
  return counts;
}

CollectiveBandwidth collective_bandwidth(const CollectiveItem& item, double time_s) {
  CollectiveBandwidth out;
  if (time_s <= 0) return out;
  out.algbw_bytes_per_s = static_cast<double>(item.bytes) / time_s;
  out.busbw_bytes_per_s = out.algbw_bytes_per_s * cost_models::bus_factor(item.op, item.group_size);
  return out;
}

}  // namespace megatune::profiler
