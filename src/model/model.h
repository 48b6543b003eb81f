// What the trainer needs of a model: the module (parameters, buffers, train/eval mode), a forward
// function from inputs to outputs (logits for the built-in models), a one-line description for the
// trace header, and what else the header must record: the files the model was read from (sha256)
// and settings of its own that change bits (the TorchScript executor's).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/module_probe.h"
#include "records/records.h"

namespace retrace::model {

struct ModelHandle {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;
  // Installs (or, with nullptr, removes) the probe the model calls around each module.
  std::function<void(ModuleProbe*)> set_probe;
  std::vector<records::FileInfo> files;
  std::vector<records::KeyValue> numerics;
};

}  // namespace retrace::model
