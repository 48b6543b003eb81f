// The public API (include/retrace/retrace.h): [user] options, registration, the recorder.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "retrace/retrace.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"
#include "core/digest.h"
#include "trace/trace_reader.h"
#include "train/optimizer.h"

namespace retrace {
namespace {

TEST(PublicApi, OptionsReadTomlValuesAndNameTheKeyOfAWrongType) {
  const Options o({{"width", "64"}, {"rate", "0.5"}, {"act", "'gelu'"}, {"deep", "true"}});
  EXPECT_EQ(o.get_int("width", 1), 64);
  EXPECT_EQ(o.get_int("absent", 7), 7);
  EXPECT_DOUBLE_EQ(o.get_float("rate", 0), 0.5);
  EXPECT_DOUBLE_EQ(o.get_float("width", 0), 64.0);  // an integer is a number
  EXPECT_EQ(o.get_string("act", ""), "gelu");
  EXPECT_TRUE(o.get_bool("deep", false));
  const std::string m = testing::error_of<ConfigError>([&] { o.get_int("rate", 0); });
  EXPECT_NE(m.find("user.rate"), std::string::npos) << m;
  EXPECT_NE(m.find("an integer"), std::string::npos) << m;
  EXPECT_THROW(o.get_bool("act", false), ConfigError);
}

TEST(PublicApi, ANameIsRegisteredOnceAndBuiltInsAreTaken) {
  Registry r;
  auto factory = [](const ModelContext&) { return model_of(torch::nn::Linear(2, 2)); };
  r.add_model("mine", factory);
  EXPECT_NE(testing::error_of<ConfigError>([&] { r.add_model("mine", factory); }).find("already registered"),
            std::string::npos);
  EXPECT_THROW(r.add_model("mlp", factory), ConfigError);
  EXPECT_THROW(r.add_data("auto", [](const DataContext&) { return Dataset{}; }), ConfigError);
  EXPECT_THROW(r.add_loss("x", Loss{}), ConfigError);
}

TEST(PublicApi, RecorderTracesAreEqualForEqualLoopsAndResumeContinuesTheChain) {
  testing::TempDir tmp;
  auto loop = [&](const std::string& dir, int64_t steps, bool resume) {
    torch::manual_seed(1);
    torch::nn::Linear model(4, 3);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
    RecorderOptions o;
    o.seed = 1;
    Recorder rec = resume ? Recorder::resume(dir, *model, opt) : Recorder::create(dir, *model, o);
    const auto x = torch::linspace(-1, 1, 32).reshape({8, 4});
    const auto y = torch::arange(8) % 3;
    for (int64_t s = static_cast<int64_t>(rec.last_step()) + 1; s <= steps; ++s) {
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
      rec.step(static_cast<uint64_t>(s), loss.item<float>(), *model, opt);
      if (s % 4 == 0) rec.checkpoint(static_cast<uint64_t>(s), *model, opt);
    }
    rec.sync();
  };
  loop(tmp.file("a"), 10, false);
  loop(tmp.file("b"), 6, false);  // stops after step 6: the checkpoint of step 4 is the newest
  loop(tmp.file("b"), 10, true);
  const auto a = trace::TraceReader::open(tmp.file("a") + "/trace.rtrace").steps();
  const auto b = trace::TraceReader::open(tmp.file("b") + "/trace.rtrace").steps();
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].param_digest, b[i].param_digest) << "step " << a[i].step;
    EXPECT_EQ(a[i].chain_digest, b[i].chain_digest) << "step " << a[i].step;
  }
  EXPECT_TRUE(std::filesystem::exists(tmp.file("b") + "/trace.set-aside.rtrace"));
  torch::nn::Linear other(4, 3);
  torch::optim::AdamW opt(other->parameters());
  EXPECT_THROW(Recorder::create(tmp.file("a"), *other, {}), ConfigError);  // exists, not empty
  EXPECT_THROW(Recorder::resume(tmp.file("none"), *other, opt), Error);
  // The validation layer before anything is applied: another model's checkpoints are all skipped,
  // naming the tensor, and the module keeps its values; another optimizer is a config error.
  torch::nn::Linear wider(4, 5);
  torch::optim::AdamW wider_opt(wider->parameters());
  const torch::Tensor weight = wider->weight.detach().clone();
  try {
    Recorder::resume(tmp.file("a"), *wider, wider_opt);
    ADD_FAILURE() << "another model's checkpoint was loaded";
  } catch (const IntegrityError& e) {
    EXPECT_NE(std::string(e.what()).find("weight"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(wider->weight, weight));
  torch::nn::Linear same(4, 3);
  torch::optim::SGD sgd(same->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor same_weight = same->weight.detach().clone();
  EXPECT_THROW(Recorder::resume(tmp.file("a"), *same, sgd), ConfigError);
  EXPECT_TRUE(torch::equal(same->weight, same_weight));
}

// The tensor-level API is the core the Module overloads call: for the same tensors it records the
// same digests, and its per-module digests name the module a change lies in.
TEST(PublicApi, LoopStateRecordsWhatTheModuleApiRecordsAndDigestsEachModule) {
  testing::TempDir tmp;
  auto make = [] {
    torch::manual_seed(3);
    return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::ReLU(), torch::nn::Linear(6, 3));
  };
  auto train_step = [](torch::nn::Sequential& m, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    const auto x = torch::linspace(-1, 1, 32).reshape({8, 4});
    auto loss = torch::nn::functional::cross_entropy(m->forward(x), torch::arange(8) % 3);
    loss.backward();
    opt.step();
    return loss.item<float>();
  };
  auto steps_of = [&](const std::string& dir) { return trace::TraceReader::open(dir + "/trace.rtrace").steps(); };
  {
    auto m = make();
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    Recorder rec = Recorder::create(tmp.file("module"), *m);
    for (uint64_t s = 1; s <= 3; ++s) rec.step(s, train_step(m, opt), *m, opt);
  }
  {
    auto m = make();
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    LoopState st;
    for (const auto& item : m->named_parameters()) st.parameters.emplace_back(item.key(), item.value());
    st.optimizer_kind = "sgd";
    Recorder rec = Recorder::create(tmp.file("tensors"), st);
    for (uint64_t s = 1; s <= 3; ++s) {
      const float loss = train_step(m, opt);
      st.optimizer = train::optimizer_state(opt, *m, train::OptimizerKind::kSgd);  // "<param>/momentum_buffer"
      rec.step(s, loss, st);
    }
  }
  const auto a = steps_of(tmp.file("module")), b = steps_of(tmp.file("tensors"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].param_digest, b[i].param_digest);
    EXPECT_EQ(a[i].grad_digest, b[i].grad_digest);
    EXPECT_EQ(a[i].optim_digest, b[i].optim_digest);
    EXPECT_NE(a[i].optim_digest, Digest128{});
    EXPECT_EQ(a[i].chain_digest, b[i].chain_digest);
    ASSERT_EQ(a[i].module_digests.size(), 2u);  // "0" and "2": the ReLU holds nothing
    EXPECT_EQ(a[i].module_digests[0].module, "0");
    EXPECT_EQ(a[i].module_digests[1].module, "2");
  }
  // A module's parameter changed: only its digests differ.
  {
    auto m = make();
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    Recorder rec = Recorder::create(tmp.file("changed"), *m);
    rec.step(1, train_step(m, opt), *m, opt);
    {
      torch::NoGradGuard no_grad;
      m[2]->as<torch::nn::Linear>()->bias.add_(1e-3);
    }
    for (uint64_t s = 2; s <= 3; ++s) rec.step(s, train_step(m, opt), *m, opt);
  }
  const auto c = steps_of(tmp.file("changed"));
  EXPECT_EQ(c[0].module_digests, a[0].module_digests);
  EXPECT_NE(c[1].module_digests[1].param, a[1].module_digests[1].param);
  // Overlapped digests: the same records, the worker's appends waited for before the optimizer
  // changes the tensors.
  {
    auto m = make();
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    RecorderOptions o;
    o.overlap_digests = true;
    Recorder rec = Recorder::create(tmp.file("overlap"), *m, o);
    for (uint64_t s = 1; s <= 3; ++s) {
      rec.wait();  // before zero_grad and opt.step change what the last step's digests read
      rec.step(s, train_step(m, opt), *m, opt);
    }
    rec.sync();
  }
  const auto ov = steps_of(tmp.file("overlap"));
  ASSERT_EQ(ov.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ov[i].chain_digest, a[i].chain_digest);
  // The settings are the run's: another digest version is refused by create and recorded in the config.
  RecorderOptions bad;
  bad.digest_version = 5;
  EXPECT_THROW(Recorder::create(tmp.file("bad"), LoopState{}, bad), ConfigError);
  // The data order is retrace record's sampler's: a permutation, fixed by seed and epoch.
  const auto order = data_order(7, 100, 0);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(order, data_order(7, 100, 0));
  EXPECT_NE(order, data_order(7, 100, 1));
  EXPECT_THROW(data_order(7, 100, 0, "sorted"), ConfigError);
}

}  // namespace
}  // namespace retrace
