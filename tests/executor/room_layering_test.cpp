// The executor's floors: parallel/ (groups, communicators, the launcher, gradient buckets) sits under model/
// (the layers, ring attention and MoE dispatch included), which sits under training/ (the loop). A file scan
// of the source tree checks that no include points up: nothing under executor/parallel/ includes from
// executor/model/ or executor/training/, and nothing under executor/model/ includes from executor/training/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace megatune::executor {
namespace {

namespace fs = std::filesystem;

const fs::path& source_root() {
  static const fs::path root = fs::path(MEGATUNE_SOURCE_DIR);
  return root;
}

bool is_source_file(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh" || ext == ".inc";
}

// The quoted include targets of a file, as paths from the source root: "executor/..." as written, a relative
// target ("../model/x.h", "x.h") resolved against the including file's folder.
std::vector<std::string> quoted_includes(const fs::path& file) {
  std::vector<std::string> targets;
  std::ifstream in(file);
  std::string line;
  const fs::path folder = file.parent_path();
  while (std::getline(in, line)) {
    const std::size_t hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line.compare(hash, 1, "#") != 0) continue;
    const std::size_t word = line.find_first_not_of(" \t", hash + 1);
    if (word == std::string::npos || line.compare(word, 7, "include") != 0) continue;
    const std::size_t open = line.find('"', word + 7);
    const std::size_t close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close == std::string::npos) continue;
    const std::string target = line.substr(open + 1, close - open - 1);
    const fs::path beside = (folder / target).lexically_normal();
    if (target.rfind("executor/", 0) != 0 && fs::exists(beside)) {
      targets.push_back(beside.lexically_relative(source_root()).generic_string());
    } else {
      targets.push_back(target);
    }
  }
  return targets;
}

// "file: include" for every include of a file under `floor` whose target lies under one of `above`.
std::vector<std::string> upward_includes(const std::string& floor, const std::vector<std::string>& above,
                                         int* files_scanned) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(source_root() / floor)) {
    if (!entry.is_regular_file() || !is_source_file(entry.path())) continue;
    ++*files_scanned;
    for (const std::string& target : quoted_includes(entry.path())) {
      for (const std::string& room : above) {
        if (target.rfind(room, 0) == 0) {
          found.push_back(entry.path().lexically_relative(source_root()).generic_string() + ": " + target);
        }
      }
    }
  }
  return found;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += "\n  " + line;
  return text;
}

TEST(RoomLayering, ParallelIncludesNothingFromModelOrTraining) {
  int files = 0;
  const auto found = upward_includes("executor/parallel", {"executor/model/", "executor/training/"}, &files);
  EXPECT_GT(files, 10) << "the scan found too few files under executor/parallel/";
  EXPECT_TRUE(found.empty()) << "executor/parallel/ reaches up:" << joined(found);
}

TEST(RoomLayering, ModelIncludesNothingFromTraining) {
  int files = 0;
  const auto found = upward_includes("executor/model", {"executor/training/"}, &files);
  EXPECT_GT(files, 10) << "the scan found too few files under executor/model/";
  EXPECT_TRUE(found.empty()) << "executor/model/ reaches up:" << joined(found);
}

// The scan sees an upward include where there is one: training/ includes model/ (the loop runs the layers),
// and the moved MoE dispatch and ring attention are included from model/ itself.
TEST(RoomLayering, ScanFindsIncludesThatExist) {
  int files = 0;
  const auto training_to_model = upward_includes("executor/training", {"executor/model/"}, &files);
  EXPECT_FALSE(training_to_model.empty());
  const auto model_to_model = upward_includes("executor/model", {"executor/model/ring_attention.h"}, &files);
  EXPECT_FALSE(model_to_model.empty());
}

}  // namespace
}  // namespace megatune::executor
