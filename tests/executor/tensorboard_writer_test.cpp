// TensorBoard event files: CRC-32C against its check value, scalars written and read back, and a damaged
// file refused with a line naming it.
#include "executor/training/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/user_error.h"

namespace megatune::executor {
namespace {

TEST(TensorBoardWriter, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoardWriter, ScalarsReadBackAndDamageIsRefused) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("megatune-tb-" + std::to_string(::getpid()));
  std::string path;
  {
    TensorBoardWriter writer((dir / "nested").string());
    writer.add_scalar("lm loss", 3.25, 1);
    writer.add_scalar("learning-rate", 1e-4, 1);
    writer.add_scalar("lm loss", 2.5, 300000);
    writer.flush();
    path = writer.path();
  }
  std::string version;
  const std::vector<ScalarEvent> events = read_scalar_events(path, &version);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].tag, "lm loss");
  EXPECT_EQ(events[0].value, 3.25f);
  EXPECT_EQ(events[1].tag, "learning-rate");
  EXPECT_FLOAT_EQ(events[1].value, 1e-4f);
  EXPECT_EQ(events[2].step, 300000);
  EXPECT_GT(events[2].wall_time, 1.6e9);
  // One byte changed inside the last record: its CRC no longer holds.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[bytes.size() - 8] ^= 0x01;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THROW(read_scalar_events(path), UserError);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  EXPECT_THROW(read_scalar_events(path), UserError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megatune::executor
