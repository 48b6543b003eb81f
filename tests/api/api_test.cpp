// The public API (include/retrace/retrace.h): [user] options, registration, the recorder.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "retrace/retrace.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"
#include "trace/trace_reader.h"

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

}  // namespace
}  // namespace retrace
