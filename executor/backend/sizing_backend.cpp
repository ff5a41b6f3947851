// SizingBackend: refuses every operation but allocation counting; the arena breakdown's text form.
#include "executor/backend/sizing_backend.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace megatune::executor {

void SizingBackend::refuse() {
  throw std::logic_error(
      "sizing backend: only counts allocations (begin_sizing); it holds no memory and runs "
      "no kernel");
}

std::string format_arena_breakdown(const std::vector<ArenaUse>& breakdown) {
  std::int64_t total = 0;
  std::size_t width = 5;
  for (const ArenaUse& u : breakdown) {
    total += u.bytes;
    width = std::max(width, u.what.size());
  }
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  char line[512];
  for (const ArenaUse& u : breakdown) {
    std::snprintf(line, sizeof line, "  %-*s %9.3f GiB %5.1f%%  (%d allocation%s)\n", int(width),
                  u.what.c_str(), double(u.bytes) / kGiB,
                  total > 0 ? 100.0 * double(u.bytes) / double(total) : 0.0, u.allocations,
                  u.allocations == 1 ? "" : "s");
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-*s %9.3f GiB\n", int(width), "total", double(total) / kGiB);
  out += line;
  return out;
}

}  // namespace megatune::executor
