// Checkpoint directory naming, tracker file reading, dtype names and metadata percent-encoding.
#include "executor/checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/checkpoint/crc32c.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

int64_t tensor_dtype_size_bytes(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::fp32:
    case TensorDType::int32:
      return 4;
    case TensorDType::bf16:
    case TensorDType::fp16:
      return 2;
    case TensorDType::int64:
      return 8;
    case TensorDType::uint8:
      return 1;
  }
  return 0;
}

std::string tensor_dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::fp32:
      return "fp32";
    case TensorDType::bf16:
      return "bf16";
    case TensorDType::fp16:
      return "fp16";
    case TensorDType::int32:
      return "int32";
    case TensorDType::int64:
      return "int64";
    case TensorDType::uint8:
      return "uint8";
  }
  return "unknown";
}

std::optional<TensorDType> tensor_dtype_from_name(const std::string& name) {
  for (const TensorDType dtype : {TensorDType::fp32, TensorDType::bf16, TensorDType::fp16, TensorDType::int32,
                                  TensorDType::int64, TensorDType::uint8}) {
    if (tensor_dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

std::string iteration_directory_name(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

std::string iteration_directory(const std::string& save_root, int64_t iteration) {
  return (fs::path(save_root) / iteration_directory_name(iteration)).string();
}

std::string staging_directory(const std::string& save_root, int64_t iteration) {
  return iteration_directory(save_root, iteration) + ".staging";
}

std::string tracker_file_path(const std::string& save_root) {
  return (fs::path(save_root) / kTrackerFileName).string();
}

std::optional<int64_t> read_latest_iteration(const std::string& save_root) {
  const std::string path = tracker_file_path(save_root);
  std::error_code error;
  if (!fs::exists(path, error)) return std::nullopt;
  std::string text = read_regular_file(path, "checkpoint tracker", 4096);
  text = text.substr(0, text.find('\n'));
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  text.erase(0, text.find_first_not_of(" \t"));
  if (text == "release") {
    throw UserError(
        "checkpoint tracker " + path +
        " says 'release'; megatune loads numbered iterations: write the iteration number into it");
  }
  const bool digits = !text.empty() && text.size() < 19 && std::all_of(text.begin(), text.end(), ::isdigit);
  if (!digits) {
    throw UserError("checkpoint tracker " + path + " holds '" + text +
                    "' instead of an iteration number; restore it or write the number of a saved iteration");
  }
  return std::stoll(text);
}

std::vector<int64_t> list_checkpoint_iterations(const std::string& save_root) {
  std::vector<int64_t> iterations;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_root, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("iter_", 0) != 0 || name.size() <= 5) continue;
    const std::string number = name.substr(5);
    if (!std::all_of(number.begin(), number.end(), ::isdigit) || number.size() > 18) continue;
    iterations.push_back(std::stoll(number));
  }
  std::sort(iterations.begin(), iterations.end());
  return iterations;
}

std::string checksum_hex(uint32_t checksum) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", checksum);
  return text;
}

std::string with_end_checksum(const std::string& body) {
  return body + "end " + checksum_hex(crc32c_update(0, body.data(), body.size())) + "\n";
}

std::string check_end_checksum(const std::string& text, size_t* body_size, uint32_t* checksum) {
  if (text.empty() || text.back() != '\n') return "is truncated (no final line)";
  const size_t last_start = text.size() < 2 ? std::string::npos : text.rfind('\n', text.size() - 2);
  *body_size = last_start == std::string::npos ? 0 : last_start + 1;
  const std::string last_line = text.substr(*body_size, text.size() - *body_size - 1);
  *checksum = crc32c_update(0, text.data(), *body_size);
  if (last_line.rfind("end ", 0) != 0) return "is truncated (no end line)";
  if (last_line.substr(4) != checksum_hex(*checksum)) return "fails its checksum";
  return "";
}

std::string percent_encode(const std::string& bytes) {
  static const char* kHex = "0123456789ABCDEF";
  std::string text;
  text.reserve(bytes.size());
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u > 0x20 && u < 0x7F && u != '%') {
      text.push_back(c);
    } else {
      text.push_back('%');
      text.push_back(kHex[u >> 4]);
      text.push_back(kHex[u & 0xF]);
    }
  }
  if (text.empty()) text.push_back('%');  // an empty value still needs a token in the manifest line
  return text;
}

std::string percent_decode(const std::string& text) {
  if (text == "%") return "";
  std::string bytes;
  bytes.reserve(text.size());
  const auto hex = [&](char h) -> int {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    throw std::invalid_argument("bad percent escape");
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      bytes.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) {
      throw std::invalid_argument("truncated percent escape");
    }
    bytes.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
    i += 2;
  }
  return bytes;
}

}  // namespace megatune::executor::checkpoint
