#include "model/mlp.h"

#include <torch/nn/functional.h>
#include <torch/nn/modules/linear.h>

#include <sstream>

#include "core/error.h"
#include "model/dropout.h"
#include "model/fused.h"
#include "model/owned_linear.h"

namespace retrace::model {

MlpImpl::MlpImpl(const MlpOptions& options) : options_(options) {
  layers_ = register_module("layers", torch::nn::ModuleList());
  int64_t in = options.inputs;
  for (int64_t width : options.hidden) {
    torch::nn::Linear layer(torch::nn::LinearOptions(in, width));
    layers_->push_back(layer);
    in = width;
  }
  torch::nn::Linear head(torch::nn::LinearOptions(in, options.outputs));
  layers_->push_back(head);
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  namespace F = torch::nn::functional;
  const size_t n = layers_->size();
  for (size_t i = 0; i < n; ++i) {
    const std::string name = "layers." + std::to_string(i);
    if (probe_) probe_->begin_module(name, "Linear");
    auto& layer = *layers_[i]->as<torch::nn::Linear>();
    x = owned_linear_applies(x, layer.weight) ? owned_linear(x, layer.weight, layer.bias) : layer.forward(x);
    if (probe_) probe_->end_module(name, "Linear", x);
    if (i + 1 == n) break;
    switch (options_.activation) {
      case Activation::kRelu: x = torch::relu(x); break;
      case Activation::kGelu:  // "torch": exactly the call this model made before the key existed
        x = options_.gelu_impl == GeluImpl::kTorch ? torch::gelu(x) : gelu(x, options_.gelu_impl);
        break;
      case Activation::kTanh: x = torch::tanh(x); break;
    }
    if (options_.dropout > 0) x = dropout(x, options_.dropout, is_training(), options_.dropout_impl);
  }
  return x;
}

std::string MlpImpl::describe() const {
  std::ostringstream out;
  out << "mlp " << options_.inputs;
  for (auto h : options_.hidden) out << "-" << h;
  out << "-" << options_.outputs << " activation=" << option_name(options_.activation)
      << " dropout=" << options_.dropout;
  return out.str();
}

}  // namespace retrace::model
