// TensorBoardWriter: scalar summaries in TensorBoard's event-file format, as Megatron's --tensorboard-dir
// writes them (SummaryWriter.add_scalar): a TFRecord file (length, masked CRC-32C of the length, an Event
// protocol buffer, masked CRC-32C of it) named events.out.tfevents.<seconds>.<host>, whose first event
// carries the file version and each later one a scalar (tag, simple_value) at a step.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace megatune::executor {

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it; UserError naming --tensorboard-dir when it
  // cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  void add_scalar(const std::string& tag, double value, std::int64_t step);
  void flush();  // the events so far reach the file (TensorBoard reads a file while it grows)
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

// The CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it.
std::uint32_t crc32c(const void* data, std::size_t size);
std::uint32_t masked_crc32c(const void* data, std::size_t size);

// One scalar read back from an event file (for tests and `megatune report`).
struct ScalarEvent {
  std::string tag;
  std::int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
// Every scalar event of an event file, checking each record's CRCs; UserError naming the file for a
// damaged one. `file_version` receives the first event's version string.
std::vector<ScalarEvent> read_scalar_events(const std::string& path, std::string* file_version = nullptr);

}  // namespace megatune::executor
