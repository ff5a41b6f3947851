// Safetensors reading (header checks, tensor reads, fp32 conversion) and writing.
#include "executor/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/user_error.h"
#include "executor/checkpoint/durable_file.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit
const char* const kRewrite = "re-download or re-save it (e.g. with safetensors.torch.save_file)";

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw UserError("safetensors file " + path + " " + what + "; " + kRewrite);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);  // to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7E00;
  if (magnitude >= 65520.0f) return sign | 0x7C00;  // rounds past the largest half: infinity
  if (magnitude < 6.103515625e-05f) {               // subnormal half: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  const uint32_t rounding = 0xFFF + ((bits >> 13) & 1);
  const uint32_t rounded = (bits & 0x7FFFFFFF) + rounding;
  return sign | static_cast<uint16_t>(((rounded >> 23) - 112) << 10 | ((rounded >> 13) & 0x3FF));
}

int64_t checked_int(const json& value, const std::string& path, const std::string& what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0)
    bad_file(path, "has a bad header: " + what + " is not a non-negative integer");
  return value.get<int64_t>();
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value,
                             int64_t data_bytes) {
  const std::string where = "tensor '" + name + "'";
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
      !value.contains("data_offsets"))
    bad_file(path, "has a bad header: " + where + " lacks dtype, shape or data_offsets");
  SafetensorsEntry e;
  e.name = name;
  const json& dtype = value["dtype"];
  const std::optional<TensorDType> parsed =
      dtype.is_string() ? safetensors_dtype_from_name(dtype.get<std::string>()) : std::nullopt;
  if (!parsed)
    throw UserError("safetensors file " + path + ": " + where + " has dtype " + dtype.dump() +
                    ", which megatune does not read (F32, BF16, F16, I32, I64, U8); save it in one of those");
  e.dtype = *parsed;
  if (!value["shape"].is_array()) bad_file(path, "has a bad header: the shape of " + where + " is no list");
  int64_t elements = 1;
  for (const json& d : value["shape"]) {
    e.shape.push_back(checked_int(d, path, "a dimension of " + where));
    if (e.shape.back() != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / e.shape.back())
      bad_file(path, "has a bad header: the shape of " + where + " is too large");
    elements *= e.shape.back();
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    bad_file(path, "has a bad header: data_offsets of " + where + " is not [begin, end]");
  const int64_t begin = checked_int(offsets[0], path, "data_offsets of " + where);
  const int64_t end = checked_int(offsets[1], path, "data_offsets of " + where);
  if (begin > end || end > data_bytes)
    bad_file(path, "is truncated or damaged: " + where + " lies at bytes [" + std::to_string(begin) + ", " +
                       std::to_string(end) + ") of a data section of " + std::to_string(data_bytes) +
                       " bytes");
  if (end - begin != elements * tensor_dtype_size_bytes(e.dtype))
    bad_file(path, "is damaged: " + where + " has shape of " + std::to_string(elements) + " elements of " +
                       dtype.get<std::string>() + " but " + std::to_string(end - begin) + " bytes");
  e.offset_bytes = begin;
  e.size_bytes = end - begin;
  return e;
}

}  // namespace

std::string safetensors_dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::fp32:
      return "F32";
    case TensorDType::bf16:
      return "BF16";
    case TensorDType::fp16:
      return "F16";
    case TensorDType::int32:
      return "I32";
    case TensorDType::int64:
      return "I64";
    case TensorDType::uint8:
      return "U8";
  }
  return "F32";
}

std::optional<TensorDType> safetensors_dtype_from_name(const std::string& name) {
  for (TensorDType d : {TensorDType::fp32, TensorDType::bf16, TensorDType::fp16, TensorDType::int32,
                        TensorDType::int64, TensorDType::uint8})
    if (safetensors_dtype_name(d) == name) return d;
  return std::nullopt;
}

int64_t SafetensorsEntry::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::error_code error;
  const auto size = fs::file_size(path_, error);
  if (error) throw UserError("safetensors file " + path_ + " cannot be read: " + error.message());
  file_bytes_ = static_cast<int64_t>(size);
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw UserError("safetensors file " + path_ + " cannot be opened; check its permissions");
  if (file_bytes_ < 8) bad_file(path_, "is truncated (" + std::to_string(file_bytes_) + " bytes, no header)");
  uint8_t length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length_bytes[i];
  if (header_bytes > static_cast<uint64_t>(file_bytes_ - 8) || header_bytes > kMaxHeaderBytes)
    bad_file(path_, "is truncated or not safetensors: its header length " + std::to_string(header_bytes) +
                        " runs past the end of the file (" + std::to_string(file_bytes_) + " bytes)");
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) bad_file(path_, "could not be read to the end of its header");
  const json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) bad_file(path_, "has a header that is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
  const int64_t data_bytes = file_bytes_ - data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad_file(path_, "has a __metadata__ that is not an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) bad_file(path_, "has a __metadata__ value that is not a string");
        metadata_[key] = text_value.get<std::string>();
      }
      continue;
    }
    entries_.push_back(parse_entry(path_, name, value, data_bytes));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->offset_bytes != b->offset_bytes ? a->offset_bytes < b->offset_bytes
                                              : a->size_bytes < b->size_bytes;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& a = *by_offset[i - 1];
    const SafetensorsEntry& b = *by_offset[i];
    if (b.size_bytes > 0 && a.offset_bytes + a.size_bytes > b.offset_bytes)
      bad_file(path_, "is damaged: tensors '" + a.name + "' and '" + b.name + "' overlap");
  }
  for (SafetensorsEntry& e : entries_) e.offset_bytes += data_start;
  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.offset_bytes < b.offset_bytes;
  });
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::vector<uint8_t> SafetensorsFile::read_bytes(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw UserError("safetensors file " + path_ + " holds no tensor '" + name + "'");
  std::vector<uint8_t> bytes(static_cast<size_t>(e->size_bytes));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(e->offset_bytes);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) bad_file(path_, "could not be read at tensor '" + name + "' (truncated since it was opened?)");
  return bytes;
}

std::vector<float> SafetensorsFile::read_floats(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e != nullptr && e->dtype != TensorDType::fp32 && e->dtype != TensorDType::bf16 &&
      e->dtype != TensorDType::fp16)
    throw UserError("safetensors file " + path_ + ": tensor '" + name + "' is " +
                    safetensors_dtype_name(e->dtype) + ", not a float type (F32, BF16, F16)");
  const std::vector<uint8_t> bytes = read_bytes(name);
  return decode_floats(bytes, e->dtype);
}

std::vector<uint8_t> encode_floats(std::span<const float> values, TensorDType dtype) {
  std::vector<uint8_t> out;
  if (dtype == TensorDType::fp32) {
    out.resize(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  if (dtype != TensorDType::bf16 && dtype != TensorDType::fp16)
    throw std::invalid_argument("encode_floats: not a float dtype");
  out.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = dtype == TensorDType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
    out[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return out;
}

std::vector<float> decode_floats(std::span<const uint8_t> bytes, TensorDType dtype) {
  std::vector<float> out;
  if (dtype == TensorDType::fp32) {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
  }
  if (dtype != TensorDType::bf16 && dtype != TensorDType::fp16)
    throw std::invalid_argument("decode_floats: not a float dtype");
  out.resize(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8);
    out[i] = dtype == TensorDType::bf16 ? bf16_to_float(h) : f16_to_float(h);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name))
      throw UserError("safetensors file " + path + ": tensor name '" + t.name + "' is empty or repeated");
    if (static_cast<int64_t>(t.bytes.size()) != elements * tensor_dtype_size_bytes(t.dtype))
      throw std::invalid_argument("write_safetensors: " + t.name + " has the wrong byte count");
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + static_cast<int64_t>(t.bytes.size())}}};
    offset += static_cast<int64_t>(t.bytes.size());
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  const std::string temporary = path + ".tmp";
  {
    DurableFile out(temporary);
    out.write(length, 8);
    out.write(text.data(), text.size());
    for (const SafetensorsTensor& t : tensors) out.write(t.bytes.data(), t.bytes.size());
    out.close();
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) throw UserError("cannot rename " + temporary + " to " + path + ": " + error.message());
}

}  // namespace megatune::executor::checkpoint
