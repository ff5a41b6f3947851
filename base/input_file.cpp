// Non-blocking, regular-file-only opening of user-given input paths.
#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/user_error.h"

namespace megatune {
namespace {

std::string reason_for_mode(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

[[noreturn]] void throw_not_regular(const std::string& path, const std::string& what,
                                    const std::string& reason) {
  if (reason == "does not exist") throw UserError(what + " " + path + " does not exist; check the path");
  throw UserError(what + " " + path + " " + reason + ", not a regular file; give the path of a file");
}

}  // namespace

std::string non_regular_file_reason(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) {
    return errno == ENOENT || errno == ENOTDIR ? "does not exist"
                                               : std::string("cannot be read (") + std::strerror(errno) + ")";
  }
  return reason_for_mode(status.st_mode);
}

void require_regular_file(const std::string& path, const std::string& what) {
  const std::string reason = non_regular_file_reason(path);
  if (!reason.empty()) throw_not_regular(path, what, reason);
}

int open_regular_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw UserError(what + " is empty; give the path of a file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) throw_not_regular(path, what, "does not exist");
    if (error == EISDIR) throw_not_regular(path, what, "is a directory");
    throw UserError(what + " " + path + " cannot be opened (" + std::strerror(error) +
                    "); check the path and its permissions");
  }
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    const std::string reason = reason_for_mode(status.st_mode);
    ::close(fd);
    throw_not_regular(path, what, reason.empty() ? "is not a regular file" : reason);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  const int fd = open_regular_file(path, what);
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      throw UserError(what + " " + path + " cannot be read (" + std::strerror(error) + "); check the file");
    }
    if (got == 0) break;
    contents.append(buffer, static_cast<std::size_t>(got));
    if (contents.size() > max_bytes) {
      ::close(fd);
      throw UserError(what + " " + path + " is larger than " + std::to_string(max_bytes >> 20) +
                      " MiB; give the intended file");
    }
  }
  ::close(fd);
  return contents;
}

}  // namespace megatune
