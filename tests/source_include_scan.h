// The include lines of the source tree, for the tests that hold each room (and each floor of the executor)
// to the rooms under it: quoted includes as paths from the source root, angle-bracket includes as written.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace megatune::source_scan {

inline const std::filesystem::path& source_root() {
  static const std::filesystem::path root = std::filesystem::path(MEGATUNE_SOURCE_DIR);
  return root;
}

inline bool is_source_file(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh" || ext == ".inc";
}

struct IncludeLine {
  std::string target;  // quoted: a path from the source root; angled: as written
  bool angled = false;
};

// The include lines of a file. A quoted target that names a file beside the includer ("../model/x.h",
// "x.h") is resolved against the includer's folder; one written from the root ("executor/x.h") stays.
inline std::vector<IncludeLine> include_lines(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::vector<IncludeLine> lines;
  std::ifstream in(file);
  std::string line;
  const fs::path folder = file.parent_path();
  while (std::getline(in, line)) {
    const std::size_t hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line.compare(hash, 1, "#") != 0) continue;
    const std::size_t word = line.find_first_not_of(" \t", hash + 1);
    if (word == std::string::npos || line.compare(word, 7, "include") != 0) continue;
    const std::size_t open = line.find_first_of("\"<", word + 7);
    if (open == std::string::npos) continue;
    const bool angled = line[open] == '<';
    const std::size_t close = line.find(angled ? '>' : '"', open + 1);
    if (close == std::string::npos) continue;
    const std::string target = line.substr(open + 1, close - open - 1);
    const fs::path beside = (folder / target).lexically_normal();
    if (!angled && !fs::exists(source_root() / target) && fs::exists(beside)) {
      lines.push_back({beside.lexically_relative(source_root()).generic_string(), false});
    } else {
      lines.push_back({target, angled});
    }
  }
  return lines;
}

// "file: target" for each include of a source file under `folder` (from the source root) for which
// `offends(line)` holds; `files_scanned` counts the files read.
template <typename Predicate>
std::vector<std::string> offending_includes(const std::string& folder, Predicate offends,
                                            int* files_scanned) {
  namespace fs = std::filesystem;
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(source_root() / folder)) {
    if (!entry.is_regular_file() || !is_source_file(entry.path())) continue;
    ++*files_scanned;
    for (const IncludeLine& line : include_lines(entry.path())) {
      if (offends(line)) {
        found.push_back(entry.path().lexically_relative(source_root()).generic_string() + ": " + line.target);
      }
    }
  }
  return found;
}

// "file: include" for every quoted include of a file under `floor` whose target lies under one of `above`.
inline std::vector<std::string> upward_includes(const std::string& floor,
                                                const std::vector<std::string>& above, int* files_scanned) {
  return offending_includes(
      floor,
      [&](const IncludeLine& line) {
        if (line.angled) return false;
        for (const std::string& room : above) {
          if (line.target.rfind(room, 0) == 0) return true;
        }
        return false;
      },
      files_scanned);
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += "\n  " + line;
  return text;
}

}  // namespace megatune::source_scan
