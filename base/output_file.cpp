// OutputFile: temporary file + fsync + rename, or checked in-place writes to a device or FIFO.
#include "base/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/user_error.h"

namespace megatune {

namespace fs = std::filesystem;

// A streambuf over a file descriptor that remembers the first write error (errno) instead of losing it.
class OutputFile::FdBuffer : public std::streambuf {
 public:
  explicit FdBuffer(int fd) : fd_(fd), buffer_(1 << 16) {
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }
  ~FdBuffer() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int error() const { return error_; }
  // Flushes and closes (fsync first when `durable`); returns the first errno, 0 on success.
  int finish(bool durable) {
    flush_buffer();
    if (durable && error_ == 0 && ::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) error_ = errno;
    if (::close(fd_) != 0 && error_ == 0) error_ = errno;
    fd_ = -1;
    return error_;
  }

 protected:
  int_type overflow(int_type ch) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return flush_buffer() ? 0 : -1; }

 private:
  bool flush_buffer() {
    const char* data = pbase();
    std::size_t size = static_cast<std::size_t>(pptr() - pbase());
    while (size > 0 && error_ == 0) {
      const ssize_t written = ::write(fd_, data, size);
      if (written < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        break;
      }
      data += written;
      size -= static_cast<std::size_t>(written);
    }
    setp(buffer_.data(), buffer_.data() + buffer_.size());
    return error_ == 0;
  }

  int fd_;
  std::vector<char> buffer_;
  int error_ = 0;
};

namespace {

std::string temporary_name(const fs::path& target) {
  static std::atomic<unsigned> counter{0};
  return (target.parent_path() / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                                  "-" + std::to_string(counter.fetch_add(1))))
      .string();
}

}  // namespace

OutputFile::OutputFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), stream_(nullptr) {
  if (path_.empty()) throw UserError(what_ + " is empty; give a file path");
  std::error_code error;
  target_ = path_;
  if (fs::is_symlink(path_, error)) {
    const fs::path resolved = fs::weakly_canonical(path_, error);
    if (!error) target_ = resolved.string();
  }
  struct stat status {};
  const bool exists = ::stat(target_.c_str(), &status) == 0;
  int fd = -1;
  if (exists && S_ISDIR(status.st_mode)) {
    throw UserError(what_ + " " + path_ + " is a directory; give a file path");
  } else if (exists && !S_ISREG(status.st_mode)) {
    // A device or FIFO: written in place. O_NONBLOCK so that a FIFO nobody reads fails instead of hanging.
    fd = ::open(target_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
      const int e = errno;
      throw UserError(what_ + " " + path_ + ": cannot write (" +
                      (e == ENXIO ? std::string("a FIFO that no process reads") : std::strerror(e)) +
                      "); give a regular file path");
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  } else {
    const fs::path parent = fs::path(target_).parent_path();
    if (!parent.empty() && !fs::exists(parent, error)) {
      fs::create_directories(parent, error);
      if (error) {
        throw UserError(what_ + " " + path_ + ": cannot create the directory " + parent.string() + " (" +
                        error.message() + "); choose a writable path");
      }
    }
    temporary_ = temporary_name(target_);
    fd = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int e = errno;
      temporary_.clear();
      throw UserError(what_ + " " + path_ + ": cannot write (" + std::strerror(e) +
                      "); choose a writable directory");
    }
    if (exists) ::fchmod(fd, status.st_mode & 07777);  // the replacement keeps the old file's permissions
  }
  buffer_ = std::make_unique<FdBuffer>(fd);
  stream_.rdbuf(buffer_.get());
}

OutputFile::~OutputFile() {
  stream_.rdbuf(nullptr);
  buffer_.reset();
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void OutputFile::commit() {
  if (committed_) return;
  stream_.flush();
  const int error = buffer_->finish(/*durable=*/!temporary_.empty());
  stream_.rdbuf(nullptr);
  if (error != 0) {
    const bool replaced_nothing = !temporary_.empty();
    if (replaced_nothing) ::unlink(temporary_.c_str());
    temporary_.clear();
    throw UserError(what_ + " " + path_ + ": writing failed (" + std::strerror(error) + ")" +
                    (replaced_nothing ? "; the previous file is unchanged" : "") +
                    "; free some space or choose another path");
  }
  if (!temporary_.empty()) {
    if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
      const int e = errno;
      ::unlink(temporary_.c_str());
      temporary_.clear();
      throw UserError(what_ + " " + path_ + ": cannot replace the file (" + std::strerror(e) +
                      "); nothing was replaced; choose a writable path");
    }
    const fs::path parent = fs::path(target_).parent_path();
    const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
  committed_ = true;
}

void write_output_file(const std::string& path, const std::string& contents, const std::string& what) {
  OutputFile file(path, what);
  file.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  file.commit();
}

}  // namespace megatune
