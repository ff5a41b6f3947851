// An on-disk cache of the single-rank reference runs the parallel-layout tests compare against. ctest runs
// every test case in a process of its own, so an in-process cache never hit and each case trained its
// reference again (half the matrix's time). A file is keyed by the reference's name and by the test
// binary's size and modification time, so any rebuild starts a new key; it is written to a temporary name
// and renamed into place, so concurrent cases at worst compute the same reference twice. Values are stored
// as their exact bits.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace megatune::executor::test {

struct ReferenceRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;  // parameter name -> the whole tensor's values
};

inline std::filesystem::path reference_run_path(const std::string& key) {
  struct stat binary {};
  std::string stamp = "unstamped";
  if (::stat("/proc/self/exe", &binary) == 0)
    stamp = std::to_string(binary.st_size) + "-" + std::to_string(binary.st_mtim.tv_sec) + "-" +
            std::to_string(binary.st_mtim.tv_nsec);
  return std::filesystem::path(MEGATUNE_BINARY_DIR) / "test-cache" / (key + "-" + stamp + ".bin");
}

namespace reference_run_io {
template <typename T>
void put(std::ostream& out, const T& value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <typename T>
bool get(std::istream& in, T& value) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&value), sizeof(T)));
}
template <typename T>
void put_vector(std::ostream& out, const std::vector<T>& values) {
  put<std::uint64_t>(out, values.size());
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
}
template <typename T>
bool get_vector(std::istream& in, std::vector<T>& values) {
  std::uint64_t n = 0;
  if (!get(in, n) || n > (std::uint64_t{1} << 32)) return false;
  values.resize(n);
  return static_cast<bool>(
      in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(n * sizeof(T))));
}
}  // namespace reference_run_io

inline std::optional<ReferenceRun> load_reference_run(const std::string& key) {
  using namespace reference_run_io;
  std::ifstream in(reference_run_path(key), std::ios::binary);
  if (!in) return std::nullopt;
  ReferenceRun run;
  std::uint64_t tensors = 0;
  if (!get_vector(in, run.losses) || !get(in, tensors)) return std::nullopt;
  for (std::uint64_t t = 0; t < tensors; ++t) {
    std::vector<char> name;
    std::vector<float> values;
    if (!get_vector(in, name) || !get_vector(in, values)) return std::nullopt;
    run.weights[std::string(name.begin(), name.end())] = std::move(values);
  }
  return run;
}

inline void store_reference_run(const std::string& key, const ReferenceRun& run) {
  using namespace reference_run_io;
  const std::filesystem::path path = reference_run_path(key);
  std::error_code ignored;
  std::filesystem::create_directories(path.parent_path(), ignored);
  const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    put_vector(out, run.losses);
    put<std::uint64_t>(out, run.weights.size());
    for (const auto& [name, values] : run.weights) {
      put_vector(out, std::vector<char>(name.begin(), name.end()));
      put_vector(out, values);
    }
    if (!out) return;  // a cache: a failed write only costs the next case a recomputation
  }
  std::filesystem::rename(temporary, path, ignored);
}

}  // namespace megatune::executor::test
