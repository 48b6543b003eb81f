// IDX files (the MNIST format), optionally gzip-compressed:
//   bytes 0-1: 0x00 0x00; byte 2: element type (0x08 = unsigned byte, the only one we read);
//   byte 3: number of dimensions d; then d big-endian u32 sizes; then the elements, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::data {

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> values;
};

// Reads an IDX file of unsigned bytes (gzip or plain). Throws IoError if the file cannot be
// opened or read, FormatError naming the path if it is not a well-formed IDX u8 array with
// `expected_rank` dimensions. Limit: 1 GiB of elements.
IdxArray read_idx_u8(const std::string& path, uint32_t expected_rank);

}  // namespace retrace::data
