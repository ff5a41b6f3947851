// Helpers shared by the libFuzzer targets that feed bytes to readers of user files: a per-process work
// directory and writing the fuzzer's bytes to a file there.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace megatune::fuzz {

// <tmp>/megatune_fuzz_<tag>_<pid>, created on first use (one tag per fuzz target process).
inline const std::filesystem::path& work_directory(const std::string& tag) {
  static const std::filesystem::path directory = [&] {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("megatune_fuzz_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path;
  }();
  return directory;
}

inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return;
  if (size > 0) std::fwrite(data, 1, size, file);
  std::fclose(file);
}

}  // namespace megatune::fuzz
