// TensorBoard event files: TFRecord framing with CRC-32C and the Event / Summary protocol buffers written by
// hand (the few fields a scalar needs: Event.wall_time = 1, step = 2, file_version = 3, summary = 5;
// Summary.value = 1; Value.tag = 1, simple_value = 2).
#include "executor/training/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/user_error.h"

namespace megatune::executor {
namespace {

const std::array<std::uint32_t, 256>& crc_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_header(std::int64_t step) {
  std::string e;
  put_varint(e, 1 << 3 | 1);  // wall_time, fixed64
  put_fixed(e, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  put_varint(e, 2 << 3 | 0);  // step, varint
  put_varint(e, static_cast<std::uint64_t>(step));
  return e;
}

// A protocol-buffer reader over one message's bytes.
struct Reader {
  const unsigned char* p;
  const unsigned char* end;
  bool ok = true;
  bool done() const { return p >= end || !ok; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      const unsigned char b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok = false;
    return 0;
  }
  template <typename T>
  T fixed() {
    T v{};
    if (end - p < static_cast<std::ptrdiff_t>(sizeof(T))) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  Reader sub() {
    const std::uint64_t n = varint();
    if (!ok || n > static_cast<std::uint64_t>(end - p)) {
      ok = false;
      return {end, end, false};
    }
    Reader r{p, p + n};
    p += n;
    return r;
  }
  void skip(int wire) {
    if (wire == 0)
      varint();
    else if (wire == 1)
      fixed<std::uint64_t>();
    else if (wire == 2)
      sub();
    else if (wire == 5)
      fixed<std::uint32_t>();
    else
      ok = false;
  }
};

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  const auto& table = crc_table();
  std::uint32_t c = 0xFFFFFFFFu;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) c = table[(c ^ bytes[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_)
    throw UserError("--tensorboard-dir " + dir + ": cannot write an event file there (" +
                    (error ? error.message() : std::string("permission denied or not a directory")) +
                    "); give a writable directory");
  std::string first = event_header(0);
  put_bytes_field(first, 3, "brain.Event:2");
  write_event(first);
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, std::int64_t step) {
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, 2 << 3 | 5);  // simple_value, fixed32
  put_fixed(v, static_cast<float>(value));
  std::string summary;
  put_bytes_field(summary, 1, v);
  std::string e = event_header(step);
  put_bytes_field(e, 5, summary);
  write_event(e);
}

void TensorBoardWriter::write_event(const std::string& event) {
  std::string record;
  const std::uint64_t length = event.size();
  put_fixed(record, length);
  put_fixed(record, masked_crc32c(&length, sizeof(length)));
  record += event;
  put_fixed(record, masked_crc32c(event.data(), event.size()));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw UserError("--tensorboard-dir: writing " + path_ + " failed (disk full?)");
}

std::vector<ScalarEvent> read_scalar_events(const std::string& path, std::string* file_version) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read this TensorBoard event file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto damaged = [&](const std::string& what) {
    return UserError(path + ": " + what + "; the event file is damaged");
  };
  std::vector<ScalarEvent> events;
  std::size_t at = 0;
  bool first = true;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) throw damaged("a record is cut short");
    std::uint64_t length = 0;
    std::uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    if (length_crc != masked_crc32c(&length, 8)) throw damaged("a record's length fails its CRC");
    if (length > bytes.size() - at - 16) throw damaged("a record is cut short");
    const char* data = bytes.data() + at + 12;
    std::memcpy(&data_crc, data + length, 4);
    if (data_crc != masked_crc32c(data, length)) throw damaged("a record fails its CRC");
    at += 16 + length;
    Reader event{reinterpret_cast<const unsigned char*>(data),
                 reinterpret_cast<const unsigned char*>(data) + length};
    ScalarEvent base;
    std::vector<ScalarEvent> found;
    while (!event.done()) {
      const std::uint64_t key = event.varint();
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (field == 1 && wire == 1) {
        base.wall_time = event.fixed<double>();
      } else if (field == 2 && wire == 0) {
        base.step = static_cast<std::int64_t>(event.varint());
      } else if (field == 3 && wire == 2) {
        Reader version = event.sub();
        if (first && file_version != nullptr)
          *file_version = std::string(reinterpret_cast<const char*>(version.p), version.end - version.p);
      } else if (field == 5 && wire == 2) {
        Reader summary = event.sub();
        while (!summary.done()) {
          const std::uint64_t skey = summary.varint();
          if (skey != (1 << 3 | 2)) {
            summary.skip(static_cast<int>(skey & 7));
            continue;
          }
          Reader value = summary.sub();
          ScalarEvent s;
          while (!value.done()) {
            const std::uint64_t vkey = value.varint();
            if (vkey == (1 << 3 | 2)) {
              Reader tag = value.sub();
              s.tag = std::string(reinterpret_cast<const char*>(tag.p), tag.end - tag.p);
            } else if (vkey == (2 << 3 | 5)) {
              s.value = value.fixed<float>();
            } else {
              value.skip(static_cast<int>(vkey & 7));
            }
          }
          if (!value.ok) throw damaged("a summary value does not parse");
          found.push_back(s);
        }
        if (!summary.ok) throw damaged("a summary does not parse");
      } else {
        event.skip(wire);
      }
    }
    if (!event.ok) throw damaged("an event does not parse");
    for (ScalarEvent& s : found) {
      s.step = base.step;
      s.wall_time = base.wall_time;
      events.push_back(std::move(s));
    }
    first = false;
  }
  return events;
}

}  // namespace megatune::executor
