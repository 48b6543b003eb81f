#include "spirals.h"

#include <cmath>
#include <random>

namespace spirals {
namespace {
double uniform(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

retrace::DataSplit split(int64_t classes, int64_t per_class, std::mt19937_64& g) {
  auto x = torch::empty({classes * per_class, 2}, torch::kFloat32);
  auto y = torch::empty({classes * per_class}, torch::kInt64);
  auto xa = x.accessor<float, 2>();
  auto ya = y.accessor<int64_t, 1>();
  const double pi = 3.14159265358979323846;
  for (int64_t c = 0; c < classes; ++c)
    for (int64_t i = 0; i < per_class; ++i) {
      const int64_t n = c * per_class + i;
      const double r = static_cast<double>(i + 1) / static_cast<double>(per_class);
      const double t = 4.0 * r + 2.0 * pi * static_cast<double>(c) / static_cast<double>(classes) +
                       0.25 * (uniform(g) - 0.5);
      xa[n][0] = static_cast<float>(r * std::sin(t));
      xa[n][1] = static_cast<float>(r * std::cos(t));
      ya[n] = c;
    }
  return {x, y};
}
}  // namespace

retrace::Dataset make_spirals(int64_t classes, int64_t train_per_class, int64_t test_per_class, uint64_t seed) {
  if (classes < 2 || train_per_class < 1 || test_per_class < 0)
    throw retrace::ConfigError("spirals: need user.classes >= 2 and user.train_per_class >= 1");
  std::mt19937_64 g(seed);
  retrace::Dataset d;
  d.train = split(classes, train_per_class, g);
  if (test_per_class > 0) d.test = split(classes, test_per_class, g);
  d.classes = classes;
  d.description = "spirals: " + std::to_string(classes) + " arms, " + std::to_string(classes * train_per_class) +
                  " train / " + std::to_string(classes * test_per_class) + " test points";
  return d;
}

ResMlpImpl::ResMlpImpl(int64_t in, int64_t width, int64_t depth, int64_t out) {
  input = register_module("input", torch::nn::Linear(in, width));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < depth; ++i) {
    torch::nn::Sequential block(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})),
                                torch::nn::Linear(width, 2 * width), torch::nn::Functional(torch::gelu, "none"),
                                torch::nn::Linear(2 * width, width));
    blocks->push_back(block);
  }
  output = register_module("output", torch::nn::Linear(width, out));
}

torch::Tensor ResMlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = input->forward(x);
  for (const auto& block : *blocks) h = h + block->as<torch::nn::Sequential>()->forward(h);
  return output->forward(h);
}

torch::Tensor smoothed_cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, double smoothing) {
  const auto logp = torch::log_softmax(logits.to(torch::kFloat32), -1);
  const auto nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  const auto uniform = -logp.mean(-1);
  return ((1.0 - smoothing) * nll + smoothing * uniform).sum();
}

retrace::Registry registry() {
  retrace::Registry r;
  r.add_model("resmlp", [](const retrace::ModelContext& ctx) {
    if (ctx.sample_shape.size() != 1) throw retrace::ConfigError("model.kind = \"resmlp\" takes vector samples");
    return retrace::model_of(
        ResMlp(ctx.sample_shape[0], ctx.options.get_int("width", 32), ctx.options.get_int("depth", 2), ctx.classes));
  });
  r.add_data("spirals", [](const retrace::DataContext& ctx) {
    return make_spirals(ctx.options.get_int("classes", 3), ctx.options.get_int("train_per_class", 400),
                        ctx.options.get_int("test_per_class", 100),
                        static_cast<uint64_t>(ctx.options.get_int("data_seed", 11)));
  });
  r.add_loss("smoothed_ce", [](const torch::Tensor& logits, const torch::Tensor& targets) {
    return smoothed_cross_entropy_sum(logits, targets, 0.05);
  });
  return r;
}

}  // namespace spirals
