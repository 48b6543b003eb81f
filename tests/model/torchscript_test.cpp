// model::load_torchscript: the wrapper's tensors are the scripted module's (names, shapes, the
// same storage through an optimizer step and to()), train()/eval() reach the scripted dropout, the
// executor is fixed, and each kind of bad file is the documented error.
//
// examples/torchscript/tiny_mlp.pt is written by examples/torchscript/make_model.py:
// fc1 = Linear(784, 64) -> GELU -> dropout(p=0.1, self.training) -> fc2 = Linear(64, 10).
// The small bad modules are built here with torch::jit::Module::define and saved.
#include "model/torchscript.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/tensor_digest.h"
#include "testing/error_of.h"
#include "train/registry.h"
#include "testing/temp_dir.h"

namespace retrace::model {
namespace {

const std::string kTinyMlp = RETRACE_SOURCE_DIR "/examples/torchscript/tiny_mlp.pt";

std::shared_ptr<TorchScriptImpl> impl_of(const ModelHandle& h) {
  auto impl = std::dynamic_pointer_cast<TorchScriptImpl>(h.module);
  EXPECT_NE(impl, nullptr);
  return impl;
}

std::string setting(const std::string& key) {
  for (const auto& [k, v] : torchscript_executor_settings())
    if (k == key) return v;
  return "<missing>";
}

// A scripted module with parameter w = ones(4) and the given methods.
std::string save_module(const retrace::testing::TempDir& dir, const std::string& name, const std::string& code,
                        bool with_parameter = true) {
  torch::jit::Module m("__torch__.Test");
  if (with_parameter) m.register_parameter("w", torch::ones({4}), /*is_buffer=*/false);
  m.define(code);
  const std::string path = dir.file(name);
  m.save(path);
  return path;
}

TEST(TorchScript, ParametersAndBuffersAreTheScriptsTensorsUnderTheScriptsNames) {
  ModelHandle h = load_torchscript(kTinyMlp);
  auto impl = impl_of(h);
  std::map<std::string, torch::Tensor> script;
  for (const auto& p : impl->script().named_parameters()) script[p.name] = p.value;
  const std::map<std::string, std::vector<int64_t>> expected = {{"fc1.weight", {64, 784}},
                                                                {"fc1.bias", {64}},
                                                                {"fc2.weight", {10, 64}},
                                                                {"fc2.bias", {10}}};
  ASSERT_EQ(script.size(), expected.size());
  auto named = h.module->named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  std::vector<std::string> order;
  for (const auto& item : named) {
    order.push_back(item.key());
    ASSERT_TRUE(expected.count(item.key())) << item.key();
    EXPECT_EQ(item.value().sizes().vec(), expected.at(item.key())) << item.key();
    EXPECT_TRUE(item.value().is_same(script.at(item.key()))) << item.key() << " is a copy";
    EXPECT_TRUE(item.value().requires_grad()) << item.key();
  }
  EXPECT_EQ(order, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(h.module->named_buffers().size(), impl->script().named_buffers().size());
  EXPECT_NE(h.module->named_children().find("fc1"), nullptr);

  const TorchScriptFile& f = impl->file();
  EXPECT_EQ(f.path, kTinyMlp);
  EXPECT_EQ(f.size, std::filesystem::file_size(kTinyMlp));
  EXPECT_EQ(f.sha256, torchscript_sha256(kTinyMlp));
  EXPECT_EQ(f.sha256.size(), 64u);
  EXPECT_EQ(h.description, "torchscript " + kTinyMlp + " (50890 parameters, sha256 " + f.sha256.substr(0, 12) + ")");
  EXPECT_TRUE(h.set_probe != nullptr);
}

TEST(TorchScript, AnOptimizerStepThroughTheWrapperChangesWhatTheScriptedForwardComputes) {
  ModelHandle h = load_torchscript(kTinyMlp);
  auto impl = impl_of(h);
  h.module->eval();
  torch::manual_seed(3);
  const auto x = torch::randn({8, 784});
  const auto before = impl->script().forward({x}).toTensor().detach().clone();
  EXPECT_TRUE(torch::equal(h.forward(x).detach(), before));

  torch::optim::SGD opt(h.module->parameters(), torch::optim::SGDOptions(0.1));
  opt.zero_grad();
  h.forward(x).pow(2).mean().backward();
  for (const auto& p : h.module->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0) << p.key();
  }
  opt.step();
  const auto after = impl->script().forward({x}).toTensor().detach();
  EXPECT_FALSE(torch::equal(after, before)) << "the script does not read the tensors the optimizer stepped";
  EXPECT_LT(after.pow(2).mean().item<double>(), before.pow(2).mean().item<double>());
}

TEST(TorchScript, TrainAndEvalSwitchTheScriptedDropout) {
  ModelHandle h = load_torchscript(kTinyMlp);
  auto impl = impl_of(h);
  torch::manual_seed(4);
  const auto x = torch::randn({16, 784});
  torch::NoGradGuard no_grad;

  h.module->eval();
  EXPECT_FALSE(impl->script().is_training());
  const auto e1 = h.forward(x);
  const auto e2 = h.forward(x);
  EXPECT_TRUE(torch::equal(e1, e2));
  // Eval is the network without dropout, computed here with ATen.
  auto p = impl->named_parameters();
  const auto manual = torch::linear(torch::gelu(torch::linear(x, p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"],
                                    p["fc2.bias"]);
  EXPECT_TRUE(torch::allclose(e1, manual, 1e-5, 1e-6));

  h.module->train();
  EXPECT_TRUE(impl->script().is_training());
  EXPECT_TRUE(impl->script().attr("fc1").toModule().is_training());
  torch::manual_seed(11);
  const auto t1 = h.forward(x);
  torch::manual_seed(11);
  const auto t2 = h.forward(x);
  const auto t3 = h.forward(x);
  EXPECT_TRUE(torch::equal(t1, t2)) << "same CPU generator state, same dropout mask";
  EXPECT_FALSE(torch::equal(t2, t3)) << "dropout draws from the CPU generator";
  EXPECT_FALSE(torch::equal(t1, e1)) << "train() did not turn the scripted dropout on";
}

TEST(TorchScript, ToMovesTheTensorsTheScriptReadsInPlace) {
  ModelHandle h = load_torchscript(kTinyMlp);
  auto impl = impl_of(h);
  h.module->eval();
  const auto* weight = impl->script().attr("fc1").toModule().attr("weight").toTensor().unsafeGetTensorImpl();
  h.module->to(torch::kDouble);
  const auto w = impl->script().attr("fc1").toModule().attr("weight").toTensor();
  EXPECT_EQ(w.scalar_type(), torch::kDouble);
  EXPECT_EQ(w.unsafeGetTensorImpl(), weight);
  EXPECT_TRUE(w.is_same(h.module->named_parameters()["fc1.weight"]));
  const auto y = h.forward(torch::randn({2, 784}, torch::kDouble));
  EXPECT_EQ(y.scalar_type(), torch::kDouble);
}

TEST(TorchScript, ExecutorOptimisationsAndFusersAreOffOnEveryThreadThatRunsForward) {
  ModelHandle h = load_torchscript(kTinyMlp);
  EXPECT_EQ(setting("torchscript.optimize"), "off");
  EXPECT_EQ(setting("torchscript.executor"), "profiling");
  EXPECT_EQ(setting("torchscript.texpr_fuser"), "off");
  EXPECT_EQ(setting("torchscript.texpr_reductions"), "off");
  EXPECT_EQ(setting("torchscript.legacy_cpu_fuser"), "off");
  EXPECT_EQ(setting("torchscript.nvfuser"), TORCH_VERSION_MAJOR < 2 ? "off" : "removed");

  // LibTorch keeps the optimize flag per thread: forward fixes it on the thread that calls it.
  h.module->eval();
  const auto x = torch::randn({4, 784});
  const auto here = h.forward(x);
  std::string before, after;
  torch::Tensor there;
  std::thread t([&] {
    before = setting("torchscript.optimize");
    there = h.forward(x);
    after = setting("torchscript.optimize");
  });
  t.join();
  EXPECT_EQ(before, "on") << "LibTorch's default on a new thread (if this changes, the comment is stale)";
  EXPECT_EQ(after, "off");
  EXPECT_TRUE(torch::equal(here, there));
}

TEST(TorchScript, MissingFileIsAnIoErrorNamingIt) {
  retrace::testing::TempDir dir;
  const std::string path = dir.file("no-such-model.pt");
  const std::string msg = testing::error_of<IoError>([&] { load_torchscript(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST(TorchScript, RandomBytesAndTextAreFormatErrors) {
  retrace::testing::TempDir dir;
  const std::string bytes = dir.file("random.pt");
  {
    std::mt19937 gen(1);
    std::ofstream out(bytes, std::ios::binary);
    for (int i = 0; i < 4096; ++i) out.put(static_cast<char>(gen() & 0xff));
  }
  const std::string text = dir.file("model.txt");
  std::ofstream(text) << "def forward(self, x):\n    return x\n";
  for (const std::string& path : {bytes, text}) {
    const std::string msg = testing::error_of<FormatError>([&] { load_torchscript(path); });
    EXPECT_NE(msg.find(path + " is not a TorchScript file (torch::jit::load: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("torch.jit.save(torch.jit.script(model), path)"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line of torch's message, no backtrace: " << msg;
  }
}

TEST(TorchScript, ForwardReturningATupleIsAFormatErrorOnTheFirstForward) {
  retrace::testing::TempDir dir;
  const std::string path = save_module(dir, "tuple.pt", R"(
def forward(self, x):
    return (x * self.w, x)
)");
  ModelHandle h = load_torchscript(path);
  const std::string msg = testing::error_of<FormatError>([&] { h.forward(torch::ones({2, 4})); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("returned Tuple[Tensor, Tensor]"), std::string::npos) << msg;
}

TEST(TorchScript, NoForwardOrTwoInputsIsAFormatErrorAndNoParametersAConfigError) {
  retrace::testing::TempDir dir;
  const std::string no_forward = save_module(dir, "no_forward.pt", R"(
def predict(self, x):
    return x * self.w
)");
  EXPECT_NE(testing::error_of<FormatError>([&] { load_torchscript(no_forward); }).find("has no forward method"),
            std::string::npos);
  const std::string two_inputs = save_module(dir, "two_inputs.pt", R"(
def forward(self, x, y):
    return x * self.w + y
)");
  EXPECT_NE(testing::error_of<FormatError>([&] { load_torchscript(two_inputs); }).find("forward takes 2 arguments"),
            std::string::npos);
  const std::string with_default = save_module(dir, "with_default.pt", R"(
def forward(self, x, scale: float = 2.0):
    return x * self.w * scale
)");
  EXPECT_NO_THROW(load_torchscript(with_default));
  const std::string no_params = save_module(dir, "no_params.pt", R"(
def forward(self, x):
    return x * 2
)",
                                            /*with_parameter=*/false);
  EXPECT_NE(testing::error_of<ConfigError>([&] { load_torchscript(no_params); }).find("has no parameters"),
            std::string::npos);
}

// Regression (exit 70 at the first checkpoint, or in the first digest): a model file may hold a
// tensor of a dtype a checkpoint cannot store; the run refuses it before training, naming it.
TEST(TorchScript, ATensorOfADtypeCheckpointsCannotStoreIsAConfigErrorNamingIt) {
  retrace::testing::TempDir dir;
  torch::jit::Module m("__torch__.Complex");
  m.register_parameter("w", torch::ones({4}), false);
  m.register_buffer("phase", torch::zeros({2}, torch::kComplexDouble));
  m.define("def forward(self, x):\n    return x * self.w\n");
  const std::string path = dir.file("complex.pt");
  m.save(path);
  const ModelHandle h = load_torchscript(path);
  const std::string msg = testing::error_of<ConfigError>([&] { train::check_state_dtypes(*h.module, path); });
  EXPECT_NE(msg.find("model tensor phase is ComplexDouble"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  // Whatever reaches a digest or a checkpoint anyway (a library user's own module) is a
  // ConfigError there too, never an internal error.
  const torch::Tensor z = torch::zeros({2}, torch::kComplexDouble);
  EXPECT_THROW(tensor_mixed_sum(z), ConfigError);
  EXPECT_THROW(tensor_mixed_sum(z, 0, Mix::kHalves), ConfigError);
  EXPECT_NO_THROW(train::check_state_dtypes(*load_torchscript(kTinyMlp).module, kTinyMlp));
}

TEST(TorchScript, TiedParametersAreAConfigError) {
  retrace::testing::TempDir dir;
  torch::jit::Module m("__torch__.Tied");
  const auto w = torch::ones({4});
  m.register_parameter("a", w, false);
  m.register_parameter("b", w, false);
  m.define("def forward(self, x):\n    return x * self.a * self.b\n");
  const std::string path = dir.file("tied.pt");
  m.save(path);
  // Saving keeps the sharing (one storage record); if a LibTorch ever writes two copies, the
  // module is no longer tied and loads.
  torch::jit::Module back = torch::jit::load(path);
  if (!back.attr("a").toTensor().is_same(back.attr("b").toTensor())) GTEST_SKIP() << "save untied the weights";
  const std::string msg = testing::error_of<ConfigError>([&] { load_torchscript(path); });
  EXPECT_NE(msg.find("tied weights"), std::string::npos) << msg;
}

}  // namespace
}  // namespace retrace::model
