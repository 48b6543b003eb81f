#include "data/idx.h"

#include <zlib.h>

#include "core/error.h"
#include "core/file_util.h"

namespace retrace::data {
namespace {
constexpr uint64_t kMaxElements = uint64_t(1) << 30;

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  RETRACE_CHECK(f != nullptr, IoError, "cannot open ", path, ": ", fs::errno_text(errno));
  gzbuffer(f, 1 << 20);
  std::string out;
  char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      RETRACE_FAIL(FormatError, path, " is not a valid gzip file (", msg,
                   "); reinstall the data set or point data.dir at intact files");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    RETRACE_CHECK(out.size() <= kMaxElements + 64, FormatError, path, " decompresses to more than ", kMaxElements,
                  " bytes, the IDX limit");
  }
  gzclose(f);
  return out;
}
}  // namespace

IdxArray read_idx_u8(const std::string& path, uint32_t expected_rank) {
  // gzopen reads plain files transparently, so one path serves .gz and uncompressed IDX.
  const std::string bytes = gunzip_file(path);
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  RETRACE_CHECK(bytes.size() >= 4, FormatError, path, " is ", bytes.size(),
                " bytes after decompression, too short for an IDX header (4 bytes)");
  RETRACE_CHECK(u8(0) == 0 && u8(1) == 0, FormatError, path, " does not start with the IDX magic 0x0000 (found 0x",
                std::hex, int(u8(0)), int(u8(1)), ")");
  RETRACE_CHECK(u8(2) == 0x08, FormatError, path, ": IDX element type is 0x", std::hex, int(u8(2)),
                ", expected 0x08 (unsigned byte)");
  const uint32_t rank = u8(3);
  RETRACE_CHECK(rank == expected_rank, FormatError, path, ": IDX array has ", rank, " dimensions, expected ",
                expected_rank);
  RETRACE_CHECK(bytes.size() >= 4 + 4ull * rank, FormatError, path, " is cut inside its IDX header");
  IdxArray out;
  uint64_t count = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    size_t o = 4 + 4 * d;
    uint32_t v = (uint32_t(u8(o)) << 24) | (uint32_t(u8(o + 1)) << 16) | (uint32_t(u8(o + 2)) << 8) |
                 uint32_t(u8(o + 3));
    out.dims.push_back(v);
    count *= v;
    RETRACE_CHECK(count <= kMaxElements, FormatError, path, ": IDX dimensions exceed ", kMaxElements, " elements");
  }
  const uint64_t header = 4 + 4ull * rank;
  RETRACE_CHECK(bytes.size() == header + count, FormatError, path, ": IDX header promises ", count,
                " elements but the file holds ", bytes.size() - header,
                "; the file is truncated or damaged, reinstall the data set");
  out.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

}  // namespace retrace::data
