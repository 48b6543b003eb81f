#include "data/fashion_mnist.h"

#include <torch/torch.h>

#include <filesystem>

#include "core/digest.h"
#include "core/error.h"
#include "data/idx.h"

namespace retrace::data {
namespace {
// Mean and standard deviation of Fashion-MNIST's training pixels (in [0, 1]).
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

std::string find_file(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    std::string p = (std::filesystem::path(dir) / (stem + ext)).string();
    if (std::filesystem::exists(p)) return p;
  }
  std::string hint = dir == kDefaultFashionDir
                         ? std::string("; install it with: apt-get install ") + kFashionPackage
                         : std::string("; set data.dir to a directory holding the Fashion-MNIST IDX files");
  RETRACE_FAIL(IoError, "data set file missing: ", (std::filesystem::path(dir) / (stem + ".gz")).string(), hint);
}

Split load_split(const std::string& dir, const std::string& prefix, std::vector<records::FileInfo>& files) {
  std::string img_path = find_file(dir, prefix + "-images-idx3-ubyte");
  std::string lbl_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray img = read_idx_u8(img_path, 3);
  IdxArray lbl = read_idx_u8(lbl_path, 1);
  RETRACE_CHECK(img.dims[0] == lbl.dims[0], FormatError, img_path, " holds ", img.dims[0], " images but ", lbl_path,
                " holds ", lbl.dims[0], " labels");
  RETRACE_CHECK(img.dims[1] == 28 && img.dims[2] == 28, FormatError, img_path, ": images are ", img.dims[1], "x",
                img.dims[2], ", expected 28x28");
  for (uint8_t v : lbl.values) RETRACE_CHECK(v < 10, FormatError, lbl_path, ": label ", int(v), " outside 0..9");
  for (const auto& p : {img_path, lbl_path}) {
    files.push_back({p, std::filesystem::file_size(p), sha256_file_hex(p)});
  }
  const int64_t n = img.dims[0];
  Split s;
  s.inputs = torch::from_blob(img.values.data(), {n, 28 * 28}, torch::kUInt8)
                 .to(torch::kFloat32)
                 .div_(255.0f)
                 .sub_(kMean)
                 .div_(kStd);
  s.targets = torch::from_blob(lbl.values.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return s;
}
}  // namespace

Dataset load_fashion_mnist(const std::string& dir) {
  Dataset d;
  d.description = "fashion-mnist " + dir;
  d.vocab_size = 10;
  d.train = load_split(dir, "train", d.files);
  d.test = load_split(dir, "t10k", d.files);
  return d;
}

}  // namespace retrace::data
