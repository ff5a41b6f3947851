// The executor's floors: parallel/ (groups, communicators, the launcher, gradient buckets) sits under model/
// (the layers, ring attention and MoE dispatch included), which sits under training/ (the loop). A file scan
// of the source tree checks that no include points up: nothing under executor/parallel/ includes from
// executor/model/ or executor/training/, and nothing under executor/model/ includes from executor/training/.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/source_include_scan.h"

namespace megatune::executor {
namespace {

using source_scan::joined;
using source_scan::upward_includes;

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
