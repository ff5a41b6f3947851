// TokenizerPool: threads take documents of the current batch in small runs until none is left.
#include "executor/data/tokenizer_pool.h"

#include <algorithm>
#include <utility>

namespace megatune::executor::data {

namespace {
constexpr std::size_t kDocumentsPerTake = 16;
}

TokenizerPool::TokenizerPool(const TextTokenizer& tokenizer, int workers) : tokenizer_(tokenizer) {
  for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

TokenizerPool::~TokenizerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TokenizerPool::run_batch() {
  // Takes runs of documents until the batch is used up; the caller holds no lock.
  for (;;) {
    std::size_t begin = 0, end = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      begin = next_;
      end = std::min(documents_->size(), begin + kDocumentsPerTake);
      next_ = end;
    }
    if (begin >= end) return;
    try {
      for (std::size_t d = begin; d < end; ++d) {
        (*ids_)[d].clear();
        tokenizer_.tokenize((*documents_)[d], (*ids_)[d]);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      next_ = documents_->size();
      return;
    }
  }
}

void TokenizerPool::work() {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_batch();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
}

void TokenizerPool::tokenize(const std::vector<std::string>& documents,
                             std::vector<std::vector<std::int32_t>>& ids) {
  ids.resize(documents.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    documents_ = &documents;
    ids_ = &ids;
    next_ = 0;
    busy_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  start_.notify_all();
  run_batch();
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_ == 0; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

}  // namespace megatune::executor::data
