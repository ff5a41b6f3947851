// Outputs written whole or not at all. OutputFile writes to a temporary file next to the target and renames
// it over the target only after every byte was written, flushed and fsync'd: a failed or interrupted write
// leaves the previous file intact and removes the temporary. A target that is a character device or a FIFO
// (/dev/null, /dev/stdout, /dev/full) is written in place, opened without blocking (a FIFO nobody reads is
// an error, not a hang), every write checked. A directory as the target is refused.
#pragma once
#include <memory>
#include <ostream>
#include <streambuf>
#include <string>

namespace megatune {

class OutputFile {
 public:
  // Creates the parent directories and the temporary file. `what` names the input in messages, e.g.
  // "--output" or "--trace". Throws UserError (one line naming `what`, the path and the fix).
  OutputFile(std::string path, std::string what);
  ~OutputFile();  // without commit(): removes the temporary; the target is untouched
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  std::ostream& stream() { return stream_; }
  // Flushes, fsyncs and renames into place. Throws UserError when any write failed ("No space left on
  // device": nothing was replaced).
  void commit();
  const std::string& path() const { return path_; }

 private:
  class FdBuffer;
  std::string path_;
  std::string what_;
  std::string target_;     // path_ with symlinks resolved (the file that is replaced)
  std::string temporary_;  // empty when writing a device or FIFO in place
  std::unique_ptr<FdBuffer> buffer_;
  std::ostream stream_;
  bool committed_ = false;
};

// OutputFile in one call.
void write_output_file(const std::string& path, const std::string& contents, const std::string& what);

}  // namespace megatune
