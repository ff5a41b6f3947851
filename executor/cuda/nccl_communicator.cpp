// NcclCommunicator: communicator creation (world + ncclCommSplit per group), the NCCL calls of each
// collective on its group's communication stream, work handles as events, and the watchdog.
#include "executor/cuda/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/nccl_check.h"
#include "executor/parallel/framed_socket.h"

namespace megatune::executor {

using layouts::CommGroup;

namespace cuda {
namespace {

// Once per process, before NCCL reads its environment (ncclGetUniqueId or the first communicator):
// setenv is not thread-safe, so never twice.
void keep_nvls_off() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

}  // namespace

std::string new_nccl_unique_id() {
  keep_nvls_off();
  ncclUniqueId id{};
  MEGATUNE_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

ncclComm_t init_world_communicator(int world_size, int rank, const std::string& unique_id) {
  if (unique_id.size() != sizeof(ncclUniqueId::internal))
    throw std::logic_error("NCCL unique id of " + std::to_string(unique_id.size()) + " bytes (want " +
                           std::to_string(sizeof(ncclUniqueId::internal)) + ")");
  keep_nvls_off();
  ncclUniqueId id{};
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclComm_t comm = nullptr;
  MEGATUNE_NCCL_CHECK(ncclCommInitRank(&comm, world_size, id, rank));
  return comm;
}

ncclComm_t split_communicator(ncclComm_t world, int world_rank, const std::vector<int>& members,
                              bool single_member_too) {
  const auto me = std::find(members.begin(), members.end(), world_rank);
  const bool member = (members.size() > 1 || single_member_too) && me != members.end();
  // Groups of one kind are disjoint, so the lowest member names the group.
  const int color = member ? *std::min_element(members.begin(), members.end()) : NCCL_SPLIT_NOCOLOR;
  const int key = member ? static_cast<int>(me - members.begin()) : 0;  // NCCL rank = index in the group
  ncclComm_t comm = nullptr;
  MEGATUNE_NCCL_CHECK(ncclCommSplit(world, color, key, &comm, nullptr));
  return member ? comm : nullptr;
}

}  // namespace cuda

namespace {

constexpr CommGroup kAllGroups[] = {
    CommGroup::kNone,        CommGroup::kTensor,       CommGroup::kContext,   CommGroup::kData,
    CommGroup::kDataContext, CommGroup::kPipeline,     CommGroup::kExpert,    CommGroup::kExpertTensor,
    CommGroup::kExpertData,  CommGroup::kTensorExpert, CommGroup::kEmbedding, CommGroup::kWorld};

ncclDataType_t nccl_type(const Tensor& t) {
  if (t.is_int32) return ncclInt32;
  switch (t.dtype) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kFP16:
      return ncclFloat16;
    case DType::kFP32:
      return ncclFloat32;
    case DType::kFP8:
      return ncclFloat8e4m3;
  }
  return ncclFloat32;
}

std::size_t element_bytes(const Tensor& t) {
  return t.is_int32 ? 4 : static_cast<std::size_t>(layouts::dtype_bytes(t.dtype));
}

std::string group_name(CommGroup group) { return layouts::comm_group_name(group); }

// Blocking NCCL setup (ncclCommInitRank / ncclCommSplit) cannot be interrupted. While it runs, this guard
// watches the control channel and the clock: when a peer fails (its process ended, or it announced an
// error) or the setup outlasts its timeout, it writes the reason and ends the process, which the launcher
// reports, rather than let the rank hang.
class SetupGuard {
 public:
  SetupGuard(TcpRendezvous* control, int rank, double timeout_s) {
    thread_ = std::thread([this, control, rank, timeout_s] {
      const SteadyClock::time_point deadline = deadline_after(timeout_s);
      std::unique_lock<std::mutex> lock(mutex_);
      while (!done_) {
        wake_.wait_for(lock, std::chrono::milliseconds(50));
        if (done_) return;
        std::optional<std::string> reason = control != nullptr ? control->poll_failure(0) : std::nullopt;
        if (!reason && SteadyClock::now() >= deadline)
          reason = "NCCL communicator setup did not complete within " + std::to_string(int(timeout_s)) +
                   " s (a rank stopped after the rendezvous?)";
        if (!reason) continue;
        std::fprintf(stderr, "megatune: rank %d: %s; NCCL setup cannot be interrupted, so this rank ends\n",
                     rank, reason->c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
    });
  }
  ~SetupGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

// Events recycled between collectives; a taken event comes back when its last holder (the work handle, the
// watchdog) lets go.
struct NcclCommunicator::EventPool : std::enable_shared_from_this<NcclCommunicator::EventPool> {
  std::mutex mutex;
  std::vector<cudaEvent_t> free;
  ~EventPool() {
    for (cudaEvent_t e : free) cudaEventDestroy(e);
  }
  std::shared_ptr<CUevent_st> take() {
    cudaEvent_t event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!free.empty()) {
        event = free.back();
        free.pop_back();
      }
    }
    if (event == nullptr) MEGATUNE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    std::shared_ptr<EventPool> self = shared_from_this();
    return std::shared_ptr<CUevent_st>(event, [self](cudaEvent_t e) {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->free.push_back(e);
    });
  }
};

struct NcclCommunicator::Pending {
  std::shared_ptr<CUevent_st> done;
  SteadyClock::time_point issued;
  const char* what;
  CommGroup group;
};

// wait(): the compute stream waits for the event recorded after the NCCL call.
class NcclCommunicator::Work final : public CommWork {
 public:
  Work(cudaStream_t compute, std::shared_ptr<CUevent_st> done) : compute_(compute), done_(std::move(done)) {}
  ~Work() override {
    try {
      wait();
    } catch (...) {  // a destructor reports nothing; the next call on the communicator does
    }
  }
  void wait() override {
    if (!done_) return;
    MEGATUNE_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
    done_.reset();
  }

 private:
  cudaStream_t compute_;
  std::shared_ptr<CUevent_st> done_;
};

NcclCommunicator::NcclCommunicator(CudaBackend& backend, const layouts::RankGrid& grid, int world_rank,
                                   const std::string& unique_id, TcpRendezvous* control, NcclOptions options)
    : Communicator(backend),
      cuda_(backend),
      world_rank_(world_rank),
      world_size_(grid.world_size()),
      options_(options),
      control_(control),
      events_(std::make_shared<EventPool>()) {
  if (world_rank < 0 || world_rank >= world_size_)
    throw std::logic_error("NcclCommunicator: rank " + std::to_string(world_rank) +
                           " outside the grid's world");
  MEGATUNE_CUDA_CHECK(cudaGetDevice(&device_));
  try {
    create_communicators(grid, unique_id);
  } catch (const std::exception& e) {
    if (control_ != nullptr)
      control_->announce_failure("rank " + std::to_string(world_rank_) + ": " + e.what());
    throw;
  }
  if (world_size_ > 1) watchdog_ = std::thread([this] { watch(); });
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::connect(CudaBackend& backend,
                                                            const layouts::RankGrid& grid,
                                                            const LaunchEnvironment& launch,
                                                            const RendezvousOptions& rendezvous,
                                                            NcclOptions options) {
  check_layout_world_size(launch, grid.world_size());
  const std::string id = launch.world_size > 1 && launch.rank == 0 ? cuda::new_nccl_unique_id() : "";
  auto control = std::make_unique<TcpRendezvous>(launch, rendezvous, id);
  auto communicator =
      std::make_unique<NcclCommunicator>(backend, grid, launch.rank, control->blob(), control.get(), options);
  communicator->owned_control_ = std::move(control);
  return communicator;
}

NcclCommunicator::~NcclCommunicator() {
  if (std::uncaught_exceptions() > 0 && !aborted_)  // leaving with an error: peers must not wait for us
    fail("rank " + std::to_string(world_rank_) + " stopped with an error (see its output)", true);
  // Issued work finishes while the watchdog still watches: a failed peer or a timeout aborts instead.
  const auto busy = [&] {
    for (cudaStream_t s : cuda_.communication_streams())
      if (cudaStreamQuery(s) == cudaErrorNotReady) return true;
    return false;
  };
  while (!aborted_ && watchdog_.joinable() && busy())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (aborted_) return;  // ncclCommAbort freed the communicators
  for (Group& g : groups_)
    if (g.owned) ncclCommDestroy(g.comm);
  if (world_ != nullptr) ncclCommDestroy(world_);
}

void NcclCommunicator::create_communicators(const layouts::RankGrid& grid, const std::string& unique_id) {
  groups_.resize(index(CommGroup::kWorld) + 1);
  // members[r][g]: rank r's group of g (all ranks: whether two groups coincide must hold on every rank,
  // because every rank decides alike whether to split).
  std::vector<std::vector<std::vector<int>>> members(world_size_);
  for (int r = 0; r < world_size_; ++r)
    for (CommGroup g : kAllGroups)
      members[r].push_back(g == CommGroup::kWorld ? std::vector<int>{} : grid.comm_group_members(r, g));
  for (CommGroup g : kAllGroups) {
    Group& group = groups_[index(g)];
    group.members =
        g == CommGroup::kWorld ? grid.comm_group_members(world_rank_, g) : members[world_rank_][index(g)];
    group.rank = static_cast<int>(std::find(group.members.begin(), group.members.end(), world_rank_) -
                                  group.members.begin());
  }
  if (world_size_ == 1) return;
  const SetupGuard guard(control_, world_rank_, options_.setup_timeout_s);
  world_ = cuda::init_world_communicator(world_size_, world_rank_, unique_id);
  groups_[index(CommGroup::kWorld)].comm = world_;
  const auto same_everywhere = [&](CommGroup a, CommGroup b) {
    for (int r = 0; r < world_size_; ++r)
      if (members[r][index(a)] != members[r][index(b)]) return false;
    return true;
  };
  std::vector<int> world_order(world_size_);  // the world communicator's ranks
  for (int r = 0; r < world_size_; ++r) world_order[r] = r;
  const auto whole_world_everywhere = [&](CommGroup a) {
    for (int r = 0; r < world_size_; ++r)
      if (members[r][index(a)] != world_order) return false;
    return true;
  };
  for (CommGroup g : kAllGroups) {
    if (g == CommGroup::kNone || g == CommGroup::kWorld) continue;
    Group& group = groups_[index(g)];
    if (whole_world_everywhere(g)) {
      group.comm = world_;
      continue;
    }
    const auto earlier =
        std::find_if(std::begin(kAllGroups), std::find(std::begin(kAllGroups), std::end(kAllGroups), g),
                     [&](CommGroup h) { return h != CommGroup::kNone && same_everywhere(g, h); });
    if (*earlier != g) {
      group.comm = groups_[index(*earlier)].comm;
      continue;
    }
    group.comm = cuda::split_communicator(world_, world_rank_, group.members);
    group.owned = group.comm != nullptr;
  }
}

int NcclCommunicator::rank(CommGroup group) const { return groups_[index(group)].rank; }
int NcclCommunicator::size(CommGroup group) const {
  return static_cast<int>(groups_[index(group)].members.size());
}
int NcclCommunicator::global_rank(CommGroup group, int rank_in_group) const {
  return groups_[index(group)].members.at(static_cast<std::size_t>(rank_in_group));
}

std::optional<std::string> NcclCommunicator::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void NcclCommunicator::throw_if_failed() const {
  if (!aborted_) return;
  throw std::runtime_error(failure().value_or("the NCCL communicator was aborted"));
}

ncclComm_t NcclCommunicator::begin(CommGroup group, const char* what) {
  throw_if_failed();
  ncclComm_t comm = groups_[index(group)].comm;
  if (comm == nullptr)
    throw std::logic_error(std::string(what) + " over group " + group_name(group) +
                           " without a communicator");
  begin_on_stream(group);
  return comm;
}

cudaStream_t NcclCommunicator::stream(CommGroup group) {
  return cuda_.cuda_stream(Backend::Stream::communication(stream_group(group)));
}

CommHandle NcclCommunicator::finish(CommGroup group, const char* what) {
  std::shared_ptr<CUevent_st> done = events_->take();
  MEGATUNE_CUDA_CHECK(cudaEventRecord(done.get(), stream(group)));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(std::make_shared<Pending>(Pending{done, SteadyClock::now(), what, group}));
  }
  return std::make_unique<Work>(cuda_.compute_stream(), std::move(done));
}

// Issues `calls(comm, stream)` between begin and finish; a failing NCCL call ends the job on every rank.
template <typename Calls>
CommHandle NcclCommunicator::issue(CommGroup group, const char* what, Calls&& calls) {
  const std::lock_guard<std::recursive_timed_mutex> issuing(issue_mutex_);
  ncclComm_t comm = begin(group, what);
  try {
    calls(comm, stream(group));
  } catch (const std::exception& e) {
    fail("rank " + std::to_string(world_rank_) + ": " + e.what(), true);
    throw;
  }
  return finish(group, what);
}

CommHandle NcclCommunicator::do_all_reduce(CommGroup group, Tensor t, ReduceOp op) {
  return issue(group, "all-reduce", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(ncclAllReduce(t.data, t.data, std::size_t(t.numel()), nccl_type(t),
                                      op == ReduceOp::kMax ? ncclMax : ncclSum, comm, stream));
  });
}

CommHandle NcclCommunicator::do_all_gather(CommGroup group, Tensor input, Tensor output) {
  return issue(group, "all-gather", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(
        ncclAllGather(input.data, output.data, std::size_t(input.numel()), nccl_type(input), comm, stream));
  });
}

CommHandle NcclCommunicator::do_reduce_scatter(CommGroup group, Tensor input, Tensor output) {
  return issue(group, "reduce-scatter", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(ncclReduceScatter(input.data, output.data, std::size_t(output.numel()),
                                          nccl_type(input), ncclSum, comm, stream));
  });
}

CommHandle NcclCommunicator::do_broadcast(CommGroup group, Tensor t, int root_in_group) {
  return issue(group, "broadcast", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(
        ncclBroadcast(t.data, t.data, std::size_t(t.numel()), nccl_type(t), root_in_group, comm, stream));
  });
}

CommHandle NcclCommunicator::do_all_to_all(CommGroup group, Tensor input,
                                           const std::vector<std::int64_t>& send_rows, Tensor output,
                                           const std::vector<std::int64_t>& receive_rows) {
  // NCCL has no all-to-all with split sizes: grouped sends and receives of each pair's rows, as Megatron
  // (torch.distributed.all_to_all_single) does; a pair with no rows issues nothing.
  const int n = size(group);
  const std::size_t cols = std::size_t(input.cols);
  return issue(group, "all-to-all", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(ncclGroupStart());
    std::size_t sent = 0, received = 0;  // elements before the peer's block
    for (int peer = 0; peer < n; ++peer) {
      const std::size_t out = std::size_t(send_rows[peer]) * cols,
                        in = std::size_t(receive_rows[peer]) * cols;
      if (out > 0)
        MEGATUNE_NCCL_CHECK(ncclSend(static_cast<char*>(input.data) + sent * element_bytes(input), out,
                                     nccl_type(input), peer, comm, stream));
      if (in > 0)
        MEGATUNE_NCCL_CHECK(ncclRecv(static_cast<char*>(output.data) + received * element_bytes(output), in,
                                     nccl_type(output), peer, comm, stream));
      sent += out;
      received += in;
    }
    MEGATUNE_NCCL_CHECK(ncclGroupEnd());
  });
}

CommHandle NcclCommunicator::do_batch_p2p(CommGroup group, const std::vector<P2pTransferArgs>& transfers) {
  const std::vector<int>& members = groups_[index(group)].members;
  std::vector<int> peers;  // in-group ranks, checked before anything is issued
  for (const P2pTransferArgs& t : transfers) {
    const auto found = std::find(members.begin(), members.end(), t.peer_rank);
    if (found == members.end() || t.peer_rank == world_rank_)
      throw std::logic_error("point-to-point transfer with rank " + std::to_string(t.peer_rank) +
                             ", which is not another member of rank " + std::to_string(world_rank_) +
                             "'s group " + group_name(group));
    peers.push_back(static_cast<int>(found - members.begin()));
  }
  return issue(group, "p2p", [&](ncclComm_t comm, cudaStream_t stream) {
    MEGATUNE_NCCL_CHECK(ncclGroupStart());
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      const Tensor& t = transfers[i].tensor;
      if (transfers[i].send)
        MEGATUNE_NCCL_CHECK(ncclSend(t.data, std::size_t(t.numel()), nccl_type(t), peers[i], comm, stream));
      else
        MEGATUNE_NCCL_CHECK(ncclRecv(t.data, std::size_t(t.numel()), nccl_type(t), peers[i], comm, stream));
    }
    MEGATUNE_NCCL_CHECK(ncclGroupEnd());
  });
}

void NcclCommunicator::abort(const std::string& message) { fail(message, true); }

void NcclCommunicator::fail(const std::string& message, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = message;
  }
  aborted_ = true;
  if (tell_peers && control_ != nullptr) control_->announce_failure(message);
  const bool quiet = issue_mutex_.try_lock_for(std::chrono::seconds(2));
  const std::lock_guard<std::mutex> no_health_check(health_mutex_);
  for (Group& g : groups_)
    if (g.owned) ncclCommAbort(g.comm);
  if (world_ != nullptr) ncclCommAbort(world_);
  if (quiet) issue_mutex_.unlock();
}

void NcclCommunicator::synchronize() {
  throw_if_failed();
  std::vector<cudaStream_t> streams = cuda_.communication_streams();
  streams.push_back(cuda_.compute_stream());
  std::vector<std::shared_ptr<CUevent_st>> ends;
  for (cudaStream_t s : streams) {
    ends.push_back(events_->take());
    MEGATUNE_CUDA_CHECK(cudaEventRecord(ends.back().get(), s));
  }
  for (const std::shared_ptr<CUevent_st>& e : ends) {
    cudaError_t state;
    while ((state = cudaEventQuery(e.get())) == cudaErrorNotReady) {
      throw_if_failed();  // the watchdog aborted: the kernels end, or we leave now
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    MEGATUNE_CUDA_CHECK(state);
  }
  throw_if_failed();
}

std::optional<std::pair<std::string, bool>> NcclCommunicator::check_health() {
  const std::lock_guard<std::mutex> checking(health_mutex_);
  if (aborted_) return std::nullopt;
  const std::string me = "rank " + std::to_string(world_rank_);
  for (CommGroup g : kAllGroups) {
    if (groups_[index(g)].comm == nullptr) continue;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(groups_[index(g)].comm, &state);
    if (queried != ncclSuccess) state = queried;
    if (state != ncclSuccess && state != ncclInProgress)
      return std::pair(me + ": NCCL reported an asynchronous error on group " + group_name(g) + ": " +
                           ncclGetErrorString(state),
                       true);
  }
  if (control_ != nullptr)
    if (std::optional<std::string> news = control_->poll_failure(0)) return std::pair(*news, false);
  std::lock_guard<std::mutex> lock(mutex_);
  while (!pending_.empty()) {
    const cudaError_t state = cudaEventQuery(pending_.front()->done.get());
    if (state == cudaErrorNotReady) break;
    if (state != cudaSuccess)
      return std::pair(me + ": CUDA error after a collective: " + cudaGetErrorString(state), true);
    pending_.pop_front();
  }
  if (!pending_.empty() && SteadyClock::now() - pending_.front()->issued >
                               std::chrono::duration<double>(options_.collective_timeout_s)) {
    const Pending& p = *pending_.front();
    return std::pair(me + ": " + p.what + " over group " + group_name(p.group) + " did not complete within " +
                         std::to_string(int(options_.collective_timeout_s)) +
                         " s (a peer stopped issuing collectives or hung)",
                     true);
  }
  return std::nullopt;
}

void NcclCommunicator::watch() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::duration<double>(options_.watchdog_interval_s));
    if (stop_ || failure_) continue;
    lock.unlock();
    if (const auto problem = check_health()) fail(problem->first, problem->second);
    lock.lock();
  }
}

}  // namespace megatune::executor
