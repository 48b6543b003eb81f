// What the trainer needs of a model: the module (parameters, buffers, train/eval mode), a forward
// function from inputs to logits, and a one-line description for the trace header.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

#include "model/module_probe.h"

namespace retrace::model {

struct ModelHandle {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;
  // Installs (or, with nullptr, removes) the probe the model calls around each module.
  std::function<void(ModuleProbe*)> set_probe;
};

}  // namespace retrace::model
