// Who may enter whom: each room includes only from itself and the rooms under it (base under everything;
// layouts; cost_models on layouts; planner on cost_models and layouts; calibration on planner, cost_models
// and layouts; executor on layouts; profiler on the executor and cost_models; tools on all), and base,
// layouts, cost_models, planner and calibration include no CUDA header, so they build and test anywhere. A
// scan of the source tree's include lines checks both.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/source_include_scan.h"

namespace megatune::base {
namespace {

using source_scan::IncludeLine;
using source_scan::joined;
using source_scan::offending_includes;

const std::set<std::string> kRooms = {"base",        "layouts",  "cost_models", "planner",
                                      "calibration", "executor", "profiler",    "tools"};

// The room a quoted include names ("layouts/op.h" -> "layouts"); "" for a generated header or a test's.
std::string room_of(const std::string& target) {
  const std::string first = target.substr(0, target.find('/'));
  return kRooms.count(first) ? first : "";
}

// Includes of a file under `room` that reach a room outside `allowed`.
std::vector<std::string> includes_outside(const std::string& room, const std::set<std::string>& allowed,
                                          int* files_scanned) {
  return offending_includes(
      room,
      [&](const IncludeLine& line) {
        if (line.angled) return false;
        const std::string target_room = room_of(line.target);
        return !target_room.empty() && !allowed.count(target_room);
      },
      files_scanned);
}

struct Floor {
  std::string room;
  std::set<std::string> allowed;
  int min_files;
};

TEST(RoomDependencies, EachRoomIncludesOnlyTheRoomsUnderIt) {
  const std::vector<Floor> floors = {
      {"base", {"base"}, 8},
      {"layouts", {"base", "layouts"}, 20},
      {"cost_models", {"base", "layouts", "cost_models"}, 20},
      {"planner", {"base", "layouts", "cost_models", "planner"}, 20},
      {"calibration", {"base", "layouts", "cost_models", "planner", "calibration"}, 10},
      {"executor", {"base", "layouts", "executor"}, 50},
      {"profiler", {"base", "layouts", "cost_models", "executor", "profiler"}, 10},
  };
  for (const Floor& floor : floors) {
    int files = 0;
    const auto found = includes_outside(floor.room, floor.allowed, &files);
    EXPECT_GE(files, floor.min_files) << "the scan found too few files under " << floor.room << "/";
    EXPECT_TRUE(found.empty()) << floor.room << "/ reaches a room it may not enter:" << joined(found);
  }
}

bool is_cuda_header(const IncludeLine& line) {
  const std::string& t = line.target;
  for (const char* prefix :
       {"cuda", "cublas", "nccl", "cupti", "cufft", "curand", "cusparse", "nvtx", "nvml"}) {
    if (t.rfind(prefix, 0) == 0) return true;
  }
  return t.find("/cuda/") != std::string::npos || (t.size() >= 4 && t.compare(t.size() - 4, 4, ".cuh") == 0);
}

TEST(RoomDependencies, TheCpuRoomsIncludeNoCudaHeader) {
  for (const std::string room : {"base", "layouts", "cost_models", "planner", "calibration"}) {
    int files = 0;
    const auto found = offending_includes(room, is_cuda_header, &files);
    EXPECT_GT(files, 0) << room;
    EXPECT_TRUE(found.empty()) << room << "/ includes CUDA:" << joined(found);
  }
}

// The scan sees what is there: the executor includes layouts and CUDA, the profiler the executor, calibration
// the planner, and tools reach every room, so a rule above that reads empty is not empty for want of looking.
TEST(RoomDependencies, ScanFindsIncludesThatExist) {
  int files = 0;
  EXPECT_FALSE(includes_outside("executor", {"base", "executor"}, &files).empty());
  EXPECT_FALSE(
      includes_outside("calibration", {"base", "layouts", "cost_models", "calibration"}, &files).empty());
  EXPECT_FALSE(includes_outside("profiler", {"base", "layouts", "cost_models", "profiler"}, &files).empty());
  EXPECT_FALSE(offending_includes("executor", is_cuda_header, &files).empty());
  EXPECT_FALSE(includes_outside("tools", {"base"}, &files).empty());
  EXPECT_EQ(room_of("layouts/op.h"), "layouts");
  EXPECT_EQ(room_of("calibration/measured_run.h"), "calibration");
  EXPECT_EQ(room_of("git_commit.h"), "");
}

}  // namespace
}  // namespace megatune::base
