// What the trainer needs of a model: the module (parameters, buffers, train/eval mode), a forward
// function from inputs to logits, and a one-line description for the trace header.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

namespace retrace::model {

struct ModelHandle {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;
};

}  // namespace retrace::model
