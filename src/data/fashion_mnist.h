// Fashion-MNIST (or MNIST) from IDX files, held in memory as float tensors, normalized.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "trace/records.h"

namespace retrace::data {

inline constexpr const char* kDefaultFashionDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionPackage = "dataset-fashion-mnist";

struct Split {
  torch::Tensor images;  // [N, 784] float32, normalized
  torch::Tensor labels;  // [N] int64
  int64_t size() const { return labels.size(0); }
};

struct FashionMnist {
  Split train;
  Split test;
  std::vector<trace::FileInfo> files;  // the four files with size and sha256
};

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte(.gz) from `dir`. Throws IoError naming the
// missing path (and, for the default directory, the Debian package to install) and FormatError
// for malformed files or images and labels that disagree in count.
FashionMnist load_fashion_mnist(const std::string& dir);

}  // namespace retrace::data
