// A multilayer perceptron: Linear layers `layers.0 .. layers.K` with an activation and dropout
// after every hidden layer. Layers are constructed one statement at a time, in index order, so
// they draw their initial weights in a specified order: in `Sequential(Linear(..), ReLU(),
// Linear(..))` written as one expression GCC evaluates the arguments right to left, the layers
// draw their weights in reverse and the run no longer matches PyTorch's with the same seed.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "model/module_probe.h"
#include "model/options.h"

namespace retrace::model {

struct MlpOptions {
  int64_t inputs = 784;
  std::vector<int64_t> hidden = {512, 256};
  int64_t outputs = 10;
  Activation activation = Activation::kRelu;
  double dropout = 0.1;
  DropoutImpl dropout_impl = DropoutImpl::kPhilox;  // model/dropout.h
  GeluImpl gelu_impl = GeluImpl::kRetrace;          // activation gelu: model/fused.h
};

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const MlpOptions& options);
  torch::Tensor forward(torch::Tensor x);
  std::string describe() const;
  void set_probe(ModuleProbe* probe) { probe_ = probe; }

 private:
  MlpOptions options_;
  torch::nn::ModuleList layers_;
  ModuleProbe* probe_ = nullptr;
};
TORCH_MODULE(Mlp);

}  // namespace retrace::model
