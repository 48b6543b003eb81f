// A data set in memory, as the trainer sees it: inputs and targets of a train and a test split,
// indexed by sample along dimension 0. Image classification: inputs [N, 784] float32, targets [N]
// int64. Character language modelling: inputs and targets [N, context] int64 (targets shifted by
// one). The loss is over every target element, so samples and tokens are counted alike.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::data {

struct Split {
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
};

struct Dataset {
  Split train;
  Split test;
  std::vector<records::FileInfo> files;  // what it was read from, with sha256
  std::string description;
  int64_t vocab_size = 0;  // classes of the targets (10 for Fashion-MNIST)
};

}  // namespace retrace::data
