// A data set as the trainer sees it: inputs and targets of a train and a test split, indexed by
// sample along dimension 0. Image classification: inputs [N, 784] float32, targets [N] int64.
// Language modelling: inputs and targets [N, context] int64 (targets shifted by one). The loss is
// over every target element, so samples and tokens are counted alike.
//
// A split either holds its samples as two tensors (small data sets, users' own) or reads them on
// demand from a SampleSource (memory-mapped token shards, data/token_files.h), so that nothing
// proportional to the data's size is held in memory. Either way the trainer only asks for batches:
// gather(indices) and range(begin, end).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "records/records.h"

namespace retrace::data {

// Inputs and targets of some samples, CPU tensors with the samples along dimension 0.
struct Samples {
  torch::Tensor inputs;
  torch::Tensor targets;
};

// Samples read on demand. Thread safety: gather and range are const and may be called from
// several threads at once.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices` (each in [0, size())), in that order.
  virtual Samples gather(const std::vector<int64_t>& indices) const = 0;
  // The samples [begin, end), 0 <= begin <= end <= size().
  virtual Samples range(int64_t begin, int64_t end) const = 0;
};

struct Split {
  torch::Tensor inputs;
  torch::Tensor targets;
  std::shared_ptr<const SampleSource> source;  // when set, the samples (inputs, targets unset)
  int64_t size() const {
    if (source) return source->size();
    return targets.defined() ? targets.size(0) : 0;
  }
  Samples gather(const std::vector<int64_t>& indices) const;
  Samples range(int64_t begin, int64_t end) const;
};

struct Dataset {
  Split train;
  Split test;
  std::vector<records::FileInfo> files;  // what it was read from, with sha256
  std::string description;
  int64_t vocab_size = 0;  // classes of the targets (10 for Fashion-MNIST)
};

}  // namespace retrace::data
