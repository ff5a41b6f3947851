// Durable file-system steps for atomic checkpoints: write-and-fsync, fsync of a directory, atomic
// replacement of a small file, atomic directory swap. Failures throw UserError naming the path and errno.
#pragma once
#include <cstddef>
#include <string>

namespace megatune::executor::checkpoint {

// Appending writer that fsyncs on close(); the destructor closes without fsync (after an error).
class DurableFile {
 public:
  explicit DurableFile(const std::string& path);  // creates or truncates
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  void write(const void* data, size_t size_bytes);
  void write_zeros(size_t size_bytes);
  size_t size_bytes() const { return size_bytes_; }
  void close();  // fsync + close; throws on failure

 private:
  std::string path_;
  int fd_ = -1;
  size_t size_bytes_ = 0;
};

void fsync_directory(const std::string& path);
// Writes `contents` to a temporary name of this process and call (path.tmp.<pid>.<n>), fsyncs, renames over
// `path`, fsyncs the parent directory. Concurrent writers never share a temporary: the last rename wins.
void replace_file_atomically(const std::string& path, const std::string& contents);
// Creates `path` holding `contents` only if it does not exist (a written temporary hard-linked into place,
// atomic like O_CREAT | O_EXCL): false when it already exists, whoever made it. Fsyncs the parent.
bool create_file_exclusively(const std::string& path, const std::string& contents);
// Puts directory `from` at `to`: a plain rename when `to` does not exist; otherwise an atomic exchange
// (renameat2 RENAME_EXCHANGE) after which `from` holds the old directory and is removed. Fsyncs the parent.
void move_directory_into_place(const std::string& from, const std::string& to);

}  // namespace megatune::executor::checkpoint
