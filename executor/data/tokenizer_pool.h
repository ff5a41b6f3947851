// TokenizerPool: `--workers N` threads tokenizing a batch of documents in parallel; the ids come back in
// document order, identical to one thread's. The threads live as long as the pool (their BPE piece caches
// stay warm across batches).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor/data/tokenizer.h"

namespace megatune::executor::data {

class TokenizerPool {
 public:
  TokenizerPool(const TextTokenizer& tokenizer, int workers);
  ~TokenizerPool();
  TokenizerPool(const TokenizerPool&) = delete;
  TokenizerPool& operator=(const TokenizerPool&) = delete;

  // ids[i] = the tokens of documents[i] (ids is resized). With one worker it runs on the calling thread.
  void tokenize(const std::vector<std::string>& documents, std::vector<std::vector<std::int32_t>>& ids);

 private:
  void work();
  void run_batch();
  const TextTokenizer& tokenizer_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::vector<std::string>* documents_ = nullptr;
  std::vector<std::vector<std::int32_t>>* ids_ = nullptr;
  std::size_t next_ = 0;          // next document to take (under mutex_)
  std::uint64_t generation_ = 0;  // batches started
  int busy_ = 0;                  // threads still on the current batch
  bool stop_ = false;
  std::exception_ptr failure_;  // the first exception a thread met in the batch
};

}  // namespace megatune::executor::data
