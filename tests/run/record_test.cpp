// End-to-end: `record` on the real Fashion-MNIST (Debian's dataset-fashion-mnist).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "ckpt/train_state.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "testing/step_records.h"
#include "testing/temp_dir.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "run/run.h"
#include "train/environment.h"

namespace retrace::run {
namespace {
using train::Config;
using train::parse_config;

RunSummary record_into(const std::string& dir, std::vector<std::string> sets) {
  Config c = parse_config("", "test", sets);
  RecordOptions o;
  o.out_dir = dir;
  return record(train::resolve_here(c), o, {});
}

void expect_same_records(const records::StepRecord& a, const records::StepRecord& b) {
  EXPECT_EQ(testing::first_differences(a, b, /*informational=*/false), "");
}

TEST(Record, SameSeedGivesEqualRecordsDifferentSeedDoesNot) {
  testing::TempDir tmp;
  record_into(tmp.file("a"), {"train.steps=30"});
  record_into(tmp.file("b"), {"train.steps=30"});
  record_into(tmp.file("c"), {"train.steps=30", "seed=4321"});
  auto a = trace::TraceReader::open(tmp.file("a/trace.rtrace")).steps();
  auto b = trace::TraceReader::open(tmp.file("b/trace.rtrace")).steps();
  auto c = trace::TraceReader::open(tmp.file("c/trace.rtrace")).steps();
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  for (size_t i = 0; i < a.size(); ++i) expect_same_records(a[i], b[i]);
  // A different seed changes initial weights, dropout and data order: every step differs.
  ASSERT_EQ(c.size(), 30u);
  EXPECT_NE(a[0].sample_digest, c[0].sample_digest);
  EXPECT_NE(a[0].param_digest, c[0].param_digest);
  EXPECT_NE(a[29].chain_digest, c[29].chain_digest);
  EXPECT_NE(a[0].loss_bits, c[0].loss_bits);
}

TEST(Record, HeaderCarriesConfigFingerprintModelAndData) {
  testing::TempDir tmp;
  record_into(tmp.file("r"), {"train.steps=2"});
  auto reader = trace::TraceReader::open(tmp.file("r/trace.rtrace"));
  const auto& h = reader.header();
  EXPECT_EQ(h.schema, records::kTraceSchema);
  EXPECT_NE(h.config_toml.find("batch_size = 128"), std::string::npos);
  EXPECT_EQ(h.seed, 1234u);
  EXPECT_EQ(h.data_files.size(), 4u);
  EXPECT_EQ(h.params.size(), 6u);  // three Linear layers, weight and bias each
  // Portable version 2 with every kernel of the step retrace's: the GEMM library is a numerics
  // field, LibTorch's BLAS information.
  std::map<std::string, std::string> fp;
  for (const auto& kv : h.fingerprint) fp[kv.key] = kv.value;
  EXPECT_EQ(fp["numerics_version"], "2");
  EXPECT_EQ(fp["gemm"].rfind("BLIS 0.9.", 0), 0u) << fp["gemm"];
  EXPECT_EQ(fp["model_kernels"], "owned");
  EXPECT_EQ(fp.count("blas"), 0u);
  EXPECT_EQ(fp.count("info.blas"), 1u);
  EXPECT_TRUE(std::filesystem::exists(tmp.file("r/config.toml")));
}

TEST(Record, DefaultConfigReaches87PercentInThreeEpochs) {
  testing::TempDir tmp;
  RunSummary s = record_into(tmp.file("full"), {});
  EXPECT_EQ(s.steps, 3u * 468u);
  EXPECT_GE(s.test_accuracy, 0.87) << "test accuracy after 3 epochs";
  auto evals = trace::TraceReader::open(tmp.file("full/trace.rtrace")).evals();
  EXPECT_EQ(evals.size(), 3u);
}

// Regression (exit 70 after the shards were written): a state of more tensors than a manifest may
// list is a ConfigError before any shard is written.
TEST(Record, AStateTooLargeForAManifestIsAConfigErrorBeforeAnyShard) {
  testing::TempDir tmp;
  ckpt::StateSnapshot snap;
  snap.step = 3;
  snap.config_hash = "c";
  snap.rng = "r";
  const torch::Tensor one = torch::zeros({1});
  for (int i = 0; i < 120000; ++i) snap.model.emplace_back("t" + std::to_string(i), one);
  try {
    ckpt::save_snapshot(snap, tmp.path(), {}, 5);
    ADD_FAILURE() << "saved";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("its manifest would list 120000 tensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint.every_steps = 0"), std::string::npos) << msg;
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(tmp.path()))
    EXPECT_FALSE(entry.is_regular_file()) << "written: " << entry.path();
}

TEST(Record, RefusesExistingRunAndBadDataWithoutWriting) {
  testing::TempDir tmp;
  record_into(tmp.file("r"), {"train.steps=1"});
  EXPECT_THROW(record_into(tmp.file("r"), {"train.steps=1"}), ConfigError);
  EXPECT_THROW(record_into(tmp.file("nodata"), {"data.dir=\"/nonexistent/fm\""}), IoError);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("nodata")));
}

}  // namespace
}  // namespace retrace::run

namespace retrace::run {
namespace {

// A trace from another LibTorch is refused by resume and replay unless accepted, with a message
// that names both versions; the same version, or a header without the field, passes.
TEST(Record, AnotherLibTorchThanTheTraceHeadersIsRefusedUnlessAccepted) {
  const std::string ours = compat::libtorch_version();
  const std::vector<records::KeyValue> other = {{"libtorch_version", "0.9.1"}};
  try {
    check_same_libtorch(other, "RUN/trace.rtrace", "resume", false);
    FAIL() << "no error";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("recorded with LibTorch 0.9.1 and this retrace is built against LibTorch " + ours),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--accept-other-torch"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_same_libtorch(other, "RUN/trace.rtrace", "replay", true));
  EXPECT_NO_THROW(check_same_libtorch({{"libtorch_version", ours}}, "RUN/trace.rtrace", "resume", false));
  EXPECT_NO_THROW(check_same_libtorch({}, "RUN/trace.rtrace", "resume", false));
}

}  // namespace
}  // namespace retrace::run
