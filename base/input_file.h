// Input files that never block or read nonsense: a path the user gives as a file is opened without blocking
// (O_NONBLOCK) and checked to be a regular file on the open descriptor before anything is read, so a FIFO,
// a device or a directory gets one line naming the input instead of a hang or "unexpected end of input".
#pragma once
#include <cstddef>
#include <string>

namespace megatune {

// What is at `path`, in words, when it is not a regular file: "does not exist", "is a directory",
// "is a FIFO (named pipe)", "is a device", "is a socket"; empty for a regular file (symlinks followed).
std::string non_regular_file_reason(const std::string& path);

// Throws UserError "<what> <path> is a FIFO (named pipe), not a regular file; give the path of a file"
// (or "does not exist; check the path") unless `path` is a regular file. `what` names the input, e.g.
// "--cluster file" or "dataset index".
void require_regular_file(const std::string& path, const std::string& what);

// Opens `path` read-only without blocking, checks on the descriptor that it is a regular file, and returns
// the descriptor in blocking mode (the caller closes it). Throws UserError as require_regular_file does,
// or when it cannot be opened (naming errno's text).
int open_regular_file(const std::string& path, const std::string& what);

// The whole file, read through open_regular_file. Throws UserError beyond max_bytes.
std::string read_regular_file(const std::string& path, const std::string& what,
                              std::size_t max_bytes = std::size_t{1} << 30);

}  // namespace megatune
