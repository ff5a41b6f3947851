// Durable file-system steps (write + fsync, directory fsync, atomic file replacement, directory swap).
#include "executor/checkpoint/durable_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/user_error.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw UserError("checkpoint: cannot " + what + " " + path + ": " + std::strerror(error) +
                  "; check free space and permissions of the --save directory");
}

// path.tmp.<pid>.<n>, written and fsynced: a name no other process or call uses at the same time.
std::string write_temporary(const std::string& path, const std::string& contents) {
  static std::atomic<unsigned long> counter{0};
  const std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  try {
    DurableFile file(temporary);
    file.write(contents.data(), contents.size());
    file.close();
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  return temporary;
}

void fsync_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace

DurableFile::DurableFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create", path, errno);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, size_t size_bytes) {
  const auto* bytes = static_cast<const char*>(data);
  while (size_bytes > 0) {
    const ssize_t written = ::write(fd_, bytes, size_bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("write", path_, errno);
    }
    bytes += written;
    size_bytes -= static_cast<size_t>(written);
    size_bytes_ += static_cast<size_t>(written);
  }
}

void DurableFile::write_zeros(size_t size_bytes) {
  static const char kZeros[256] = {};
  while (size_bytes > 0) {
    const size_t chunk = size_bytes < sizeof(kZeros) ? size_bytes : sizeof(kZeros);
    write(kZeros, chunk);
    size_bytes -= chunk;
  }
}

void DurableFile::close() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) fail("fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", path_, errno);
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", path, errno);
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    // Some file systems do not support fsync on directories; their renames are then as durable as they get.
    if (error != EINVAL && error != ENOTSUP) fail("fsync directory", path, error);
    return;
  }
  ::close(fd);
}

void replace_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temporary = write_temporary(path, contents);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail("rename " + temporary + " to", path, error);
  }
  fsync_parent(path);
}

bool create_file_exclusively(const std::string& path, const std::string& contents) {
  const std::string temporary = write_temporary(path, contents);
  const int linked = ::link(temporary.c_str(), path.c_str());
  const int error = errno;
  ::unlink(temporary.c_str());
  if (linked != 0 && error == EEXIST) return false;
  if (linked != 0) fail("link " + temporary + " to", path, error);
  fsync_parent(path);
  return true;
}

void move_directory_into_place(const std::string& from, const std::string& to) {
  const fs::path parent = fs::path(to).parent_path();
  std::error_code error;
  if (!fs::exists(to, error)) {
    if (::rename(from.c_str(), to.c_str()) != 0) fail("rename " + from + " to", to, errno);
  } else {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
      const int exchange_error = errno;
      if (exchange_error != EINVAL && exchange_error != ENOSYS && exchange_error != ENOTSUP) {
        fail("exchange " + from + " with", to, exchange_error);
      }
#endif
      // No atomic exchange here: move the old directory aside, then the new one in. A crash between the
      // two renames leaves <to>.old, which the reader does not use; the tracker still names this
      // iteration, so the caller's next save or a manual rename recovers it.
      const std::string aside = to + ".old";
      fs::remove_all(aside, error);
      if (::rename(to.c_str(), aside.c_str()) != 0) fail("rename " + to + " to", aside, errno);
      if (::rename(from.c_str(), to.c_str()) != 0) fail("rename " + from + " to", to, errno);
      fs::remove_all(aside, error);
      fsync_directory(parent.empty() ? "." : parent.string());
      return;
#ifdef RENAME_EXCHANGE
    }
    // `from` now holds the previous directory.
    fs::remove_all(from, error);
    if (error) fail("remove the replaced directory", from, error.value());
#endif
  }
  fsync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace megatune::executor::checkpoint
