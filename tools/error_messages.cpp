// Mapping of exceptions to one user-facing line at the CLI boundary.
#include "tools/error_messages.h"

#include <new>
#include <regex>
#include <stdexcept>

#include "base/user_error.h"
#include "cost_models/sqlite_database.h"

namespace megatune::tools {
namespace {

const std::regex& source_location() {
  // "executor/cuda/cuda_backend.cpp:99: " anywhere (a rank's error may be prefixed "rank 3: ").
  static const std::regex pattern(R"([^\s:]*\.(cpp|cu|cuh|h|hpp|cc):[0-9]+:\s*)");
  return pattern;
}

bool mentions_any(const std::string& text, std::initializer_list<const char*> words) {
  for (const char* word : words)
    if (text.find(word) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string without_source_location(const std::string& message) {
  return std::regex_replace(message, source_location(), "");
}

std::string user_facing_message(const std::exception& error) {
  if (dynamic_cast<const UserError*>(&error) != nullptr) return error.what();
  if (const auto* sqlite = dynamic_cast<const cost_models::SqliteError*>(&error)) {
    const std::string detail =
        sqlite->sqlite_message().empty() ? without_source_location(sqlite->what()) : sqlite->sqlite_message();
    return "the cost database failed (" + detail +
           "); check --db (or $MEGATUNE_DB), its permissions and the free disk space";
  }
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) {
    return "out of host memory: what was asked for does not fit in this machine's RAM; lower the sizes "
           "(--seq-length, --global-batch-size, --micro-batch-size, --count, the model) or free memory";
  }
  const std::string what = error.what();
  const bool located = std::regex_search(what, source_location());
  if (located && mentions_any(what, {"cuda", "cublas", "CUDA", "cuBLAS", "nccl", "NCCL", "cupti", "CUPTI"})) {
    const std::string detail = without_source_location(what);
    if (mentions_any(detail, {"out of memory", "cudaMalloc"})) {
      return "the GPU ran out of memory (" + detail +
             "); the model and batch need more GPU memory than is free: `megatune plan` finds a layout "
             "that fits (--recompute-granularity full, a smaller --micro-batch-size, more GPUs)";
    }
    return "the GPU runtime failed (" + detail + "); check the GPU and its driver (nvidia-smi)";
  }
  return "internal error: " + what + " (a bug in megatune: please report it with the command line)";
}

}  // namespace megatune::tools
