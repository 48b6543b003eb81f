// Fashion-MNIST (or MNIST) from IDX files, held in memory as float tensors, normalized.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "data/dataset.h"

namespace retrace::data {

inline constexpr const char* kDefaultFashionDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionPackage = "dataset-fashion-mnist";

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte(.gz) from `dir`: inputs [N, 784] float32
// normalized with the training set's mean and standard deviation, targets [N] int64. Throws IoError naming the
// missing path (and, for the default directory, the Debian package to install) and FormatError
// for malformed files or images and labels that disagree in count.
Dataset load_fashion_mnist(const std::string& dir);

}  // namespace retrace::data
