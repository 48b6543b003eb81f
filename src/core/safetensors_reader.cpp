// parse_shard / read_shard: the validating reader of shard.h. Every byte of the file is accounted
// for before anything is returned.
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "core/safetensors.h"
#include "core/strict_json.h"
#include "core/error.h"
#include "core/file_util.h"

namespace retrace::safetensors {
using jsonfmt::json_text;
using jsonfmt::json_type_text;
using jsonfmt::parse_strict_json;
namespace {

using nlohmann::json;

uint64_t as_u64(const json& v, const std::string& src, const std::string& tensor, const char* field) {
  RETRACE_CHECK(v.is_number_unsigned(), FormatError, "shard ", src, ", tensor \"", tensor, "\": ", field,
                " must hold non-negative integers, found ", json_type_text(v), " ", json_text(v));
  return v.get<uint64_t>();
}

TensorEntry parse_tensor(const std::string& src, const std::string& name, const json& v, uint64_t data_size) {
  RETRACE_CHECK(v.is_object(), FormatError, "shard ", src, ", tensor \"", name,
                "\": expected an object {dtype, shape, data_offsets}, found ", json_type_text(v));
  for (const auto& [key, unused] : v.items()) {
    (void)unused;
    RETRACE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", FormatError, "shard ", src, ", tensor \"",
                  name, "\": unexpected key \"", key, "\"; expected dtype, shape, data_offsets");
  }
  TensorEntry e;
  e.name = name;
  RETRACE_CHECK(v.contains("dtype") && v["dtype"].is_string(), FormatError, "shard ", src, ", tensor \"", name,
                "\": expected a string \"dtype\"");
  e.dtype = v["dtype"].get<std::string>();
  auto elem = dtype_size(e.dtype);
  RETRACE_CHECK(elem.has_value(), FormatError, "shard ", src, ", tensor \"", name, "\": unknown dtype \"", e.dtype,
                "\"; expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL");

  RETRACE_CHECK(v.contains("shape") && v["shape"].is_array(), FormatError, "shard ", src, ", tensor \"", name,
                "\": expected an array \"shape\"");
  const json& shape = v["shape"];
  RETRACE_CHECK(shape.size() <= kMaxTensorRank, FormatError, "shard ", src, ", tensor \"", name, "\": shape has ",
                shape.size(), " dims, the limit is ", kMaxTensorRank);
  uint64_t count = 1;
  bool overflow = false;
  for (const json& d : shape) {
    uint64_t dim = as_u64(d, src, name, "shape");
    RETRACE_CHECK(dim <= uint64_t(std::numeric_limits<int64_t>::max()), FormatError, "shard ", src, ", tensor \"", name,
                  "\": dim ", dim, " does not fit in int64");
    e.shape.push_back(int64_t(dim));
    if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    else count *= dim;
  }
  // A zero dim makes the tensor empty whatever the other dims are; but LibTorch refuses a shape
  // whose other dims multiply past int64 even then (its size check multiplies every dim), so such a
  // shape is refused here, where it is read, not there.
  uint64_t nonzero = 1;
  bool too_many = false;
  for (int64_t d : e.shape) {
    if (d == 0) continue;
    if (nonzero > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(d)) too_many = true;
    else nonzero *= uint64_t(d);
  }
  RETRACE_CHECK(!too_many, FormatError, "shard ", src, ", tensor \"", name, "\": shape ", json_text(shape),
                " has more elements than fit in int64 (a zero dim does not make it valid for LibTorch)");
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
    count = 0;
    overflow = false;
  }
  RETRACE_CHECK(!overflow && count <= std::numeric_limits<uint64_t>::max() / *elem, FormatError, "shard ", src,
                ", tensor \"", name, "\": shape ", json_text(shape), " has more bytes than fit in 64 bits");
  uint64_t expected = count * *elem;

  RETRACE_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                FormatError, "shard ", src, ", tensor \"", name,
                "\": expected \"data_offsets\" as an array [begin, end]");
  uint64_t begin = as_u64(v["data_offsets"][0], src, name, "data_offsets");
  uint64_t end = as_u64(v["data_offsets"][1], src, name, "data_offsets");
  RETRACE_CHECK(begin <= end, FormatError, "shard ", src, ", tensor \"", name, "\": data_offsets [", begin, ", ", end,
                "] end before they begin");
  RETRACE_CHECK(end <= data_size, FormatError, "shard ", src, ", tensor \"", name, "\": data_offsets [", begin, ", ",
                end, "] reach past the data section of ", data_size,
                " bytes; the file is truncated or the header is damaged");
  RETRACE_CHECK(end - begin == expected, FormatError, "shard ", src, ", tensor \"", name, "\": shape ",
                json_text(shape), " of ", e.dtype, " needs ", expected, " bytes, data_offsets [", begin, ", ", end,
                "] hold ", end - begin);
  e.offset = begin;
  e.nbytes = end - begin;
  return e;
}

}  // namespace

const TensorEntry* ShardData::find(const std::string& name) const {
  for (const TensorEntry& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

// The header of a shard of `file_size` bytes from `head`, its first bytes (at least the 8-byte
// length and the JSON header; the whole file is fine), validated against the file's size.
ShardData parse_header(std::string_view head, uint64_t file_size, const std::string& src) {
  ShardData out;
  out.source = src;
  RETRACE_CHECK(file_size >= 8 && head.size() >= 8, FormatError, "shard ", src, " is ", file_size,
                " bytes, shorter than its 8-byte header length; the file is truncated");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(head[i])) << (8 * i);
  RETRACE_CHECK(n <= kMaxShardHeaderBytes, FormatError, "shard ", src, ": header length is ", n,
                " bytes, the limit is ", kMaxShardHeaderBytes, "; this is not a shard or it is damaged");
  RETRACE_CHECK(n <= file_size - 8 && n <= head.size() - 8, FormatError, "shard ", src, ": header length is ", n,
                " bytes but only ", file_size - 8, " follow; the file is truncated");
  RETRACE_CHECK(n >= 2 && head[8] == '{', FormatError, "shard ", src, ": expected the JSON header to start with '{'");
  const std::string what = "shard " + src + " header";
  json header = parse_strict_json(head.substr(8, n), what);
  RETRACE_CHECK(header.is_object(), FormatError, what, ": expected a JSON object, found ", json_type_text(header));
  out.data_start = 8 + n;
  const uint64_t data_size = file_size - out.data_start;

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      RETRACE_CHECK(value.is_object(), FormatError, what, ": \"__metadata__\" must be an object of strings, found ",
                    json_type_text(value));
      for (const auto& [mk, mv] : value.items()) {
        RETRACE_CHECK(mv.is_string(), FormatError, what, ": metadata \"", mk, "\" must be a string, found ",
                      json_type_text(mv));
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(parse_tensor(src, key, value, data_size));
  }

  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t expect = 0;
  for (const TensorEntry& e : out.tensors) {
    RETRACE_CHECK(e.offset == expect, FormatError, "shard ", src, ", tensor \"", e.name, "\": data begins at ",
                  e.offset, ", expected ", expect, " (tensor data must be contiguous, without gaps or overlaps)");
    expect = e.offset + e.nbytes;
  }
  RETRACE_CHECK(expect == data_size, FormatError, "shard ", src, ": the tensors hold ", expect,
                " bytes but the data section has ", data_size, " bytes; the file is ",
                expect > data_size ? "truncated" : "longer than its header says");
  return out;
}

}  // namespace

ShardData parse_shard(fs::FileBytes bytes, const std::string& src) {
  ShardData out = parse_header(bytes.view(), bytes.size(), src);
  out.bytes = std::move(bytes);
  return out;
}

ShardData read_shard_header(const std::string& path, fs::Links links) {
  uint64_t size = 0;
  const int fd = fs::open_regular_file_within(path, std::numeric_limits<uint64_t>::max(), size, links);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  char length[8] = {};
  const uint64_t got = size >= 8 ? fs::read_at(fd, 0, length, 8, path) : 0;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(length[i])) << (8 * i);
  // What parse_header refuses anyway is not read: a length past the limit or the file.
  if (got < 8 || n > kMaxShardHeaderBytes || n > size - 8)
    return parse_header(std::string_view(length, got), size, path);
  std::string head(8 + n, '\0');
  const uint64_t read = fs::read_at(fd, 0, head.data(), head.size(), path);
  head.resize(read);
  return parse_header(head, size, path);
}

ShardData parse_shard_header(std::string_view head, uint64_t file_size, const std::string& src) {
  return parse_header(head, file_size, src);
}

ShardData parse_shard(std::string_view bytes, const std::string& src) { return parse_shard(fs::FileBytes(bytes), src); }

ShardData read_shard(const std::string& path) {
  return parse_shard(fs::read_file_bytes(path, std::numeric_limits<uint64_t>::max()), path);
}

}  // namespace retrace::safetensors
