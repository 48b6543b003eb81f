#include "train/config.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/file_util.h"

namespace retrace::train {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(toml, "test.toml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, BuiltInDefaultEqualsShippedFile) {
  Config shipped = load_config(RETRACE_SOURCE_DIR "/configs/fashion-mlp.toml", {});
  EXPECT_EQ(to_toml(shipped), to_toml(Config{}));
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config c = parse_config("", "x", {"optim.name=sgd", "optim.lr=0.05", "model.hidden=[64, 32]"});
  EXPECT_EQ(c.optim.name, OptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.05);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{64, 32}));
  Config again = parse_config(to_toml(c), "resolved", {});
  EXPECT_EQ(to_toml(again), to_toml(c));
}

TEST(Config, KeysAddedLaterReadAsTheirOldBehaviourInRecordedConfigs) {
  // A config written by an older retrace (here: a golden run's) has neither optim.fused nor
  // model.dropout_impl. Read as recorded, it means what it meant then, and writes back to the very
  // same text, so checkpoints made before the keys existed keep their config hash.
  const std::string old_text = fs::read_file(RETRACE_SOURCE_DIR "/golden/fashion-mlp-100/config.toml", 1 << 20);
  ASSERT_EQ(old_text.find("dropout_impl"), std::string::npos);
  ASSERT_EQ(old_text.find("fused"), std::string::npos);
  ASSERT_EQ(old_text.find("gelu_impl"), std::string::npos);
  ASSERT_EQ(old_text.find("attention_matmul"), std::string::npos);
  ASSERT_EQ(old_text.find("numerics_version"), std::string::npos);
  Config recorded = parse_config(old_text, "old run", {}, ConfigSource::kRecorded);
  EXPECT_EQ(recorded.runtime.numerics_version, 1);  // the pinned thread counts it ran with
  EXPECT_EQ(recorded.model.dropout_impl, model::DropoutImpl::kTorch);
  EXPECT_EQ(recorded.model.gelu_impl, model::GeluImpl::kTorch);
  EXPECT_EQ(recorded.model.attention_matmul, model::AttentionMatmul::kBlas);
  EXPECT_FALSE(recorded.optim.fused);
  EXPECT_EQ(to_toml(recorded), old_text);
  // The same text written by a person takes today's defaults, and says so when written back.
  // Today's portable numerics (version 2) has one thread knob, so the pinned OpenBLAS count that
  // text holds is refused with the ways out.
  EXPECT_NE(error_of(old_text).find("runtime.blas_threads = 2 is set"), std::string::npos);
  Config user = parse_config(old_text, "user file", {"runtime.blas_threads=0"});
  EXPECT_EQ(user.runtime.numerics_version, 2);
  EXPECT_EQ(user.model.dropout_impl, model::DropoutImpl::kPhilox);
  EXPECT_EQ(user.model.gelu_impl, model::GeluImpl::kRetrace);
  EXPECT_EQ(user.model.attention_matmul, model::AttentionMatmul::kLanes);
  EXPECT_TRUE(user.optim.fused);
  const std::string now = to_toml(user);
  EXPECT_NE(now.find("dropout_impl = 'philox'"), std::string::npos) << now;
  EXPECT_NE(now.find("fused = true"), std::string::npos) << now;
  EXPECT_NE(now.find("gelu_impl = 'retrace'"), std::string::npos) << now;
  EXPECT_NE(now.find("attention_matmul = 'lanes'"), std::string::npos) << now;
  Config again = parse_config(now, "resolved", {}, ConfigSource::kRecorded);
  EXPECT_EQ(to_toml(again), now);
  // An explicit value in a recorded config wins over the legacy one.
  Config explicit_philox = parse_config(old_text, "old run", {"model.dropout_impl=philox"}, ConfigSource::kRecorded);
  EXPECT_EQ(explicit_philox.model.dropout_impl, model::DropoutImpl::kPhilox);
  EXPECT_EQ(parse_config(old_text, "old run", {"model.gelu_impl=retrace"}, ConfigSource::kRecorded).model.gelu_impl,
            model::GeluImpl::kRetrace);
  EXPECT_EQ(parse_config(old_text, "old run", {"model.attention_matmul=lanes"}, ConfigSource::kRecorded)
                .model.attention_matmul,
            model::AttentionMatmul::kLanes);
}

TEST(Config, EvalSectionReplacesTheOldEvalKeysWhichStillRead) {
  // A run recorded before [eval]: its keys read into [eval], and write back under their old names
  // with nothing added, so its config hash stays (its evaluations: the whole split, each epoch).
  const std::string old_text = fs::read_file(RETRACE_SOURCE_DIR "/golden/char-gpt-tiny/config.toml", 1 << 20);
  ASSERT_NE(old_text.find("eval_batch_size = 64"), std::string::npos);
  Config recorded = parse_config(old_text, "old run", {}, ConfigSource::kRecorded);
  EXPECT_TRUE(recorded.eval.legacy_keys);
  EXPECT_EQ(recorded.eval.batch_size, 64);
  EXPECT_EQ(recorded.eval.max_batches, 0);
  EXPECT_EQ(recorded.eval.every_steps, 0);
  EXPECT_TRUE(recorded.eval.each_epoch);
  EXPECT_EQ(recorded.data.order, data::Order::kShuffle);
  EXPECT_EQ(to_toml(recorded), old_text);
  EXPECT_EQ(to_toml(recorded, TomlForm::kComplete).find("\n[eval]\nevery_steps = 0\nmax_batches = 0\n") !=
                std::string::npos,
            true)
      << to_toml(recorded, TomlForm::kComplete);
  Config complete = parse_config(to_toml(recorded, TomlForm::kComplete), "complete", {}, ConfigSource::kRecorded);
  EXPECT_EQ(to_toml(complete), old_text);
  // Overrides by either name reach the same value, and keep the text's names.
  EXPECT_EQ(parse_config(old_text, "old run", {"eval.batch_size=7"}, ConfigSource::kRecorded).eval.batch_size, 7);
  Config fresh = parse_config("", "x", {"data.eval_batch_size=9", "train.eval_each_epoch=false"});
  EXPECT_FALSE(fresh.eval.legacy_keys);
  EXPECT_EQ(fresh.eval.batch_size, 9);
  EXPECT_FALSE(fresh.eval.each_epoch);
  const std::string text = to_toml(fresh);
  EXPECT_EQ(text.find("eval_batch_size"), std::string::npos) << text;
  EXPECT_NE(text.find("[eval]\neach_epoch = false\nbatch_size = 9\n"), std::string::npos) << text;
  // Defaults: the training micro-batch, 20 batches for token data, else the whole split.
  Config d = parse_config("", "x", {});
  EXPECT_EQ(eval_batch_size(d), d.data.batch_size);
  EXPECT_EQ(d.eval.max_batches, 0);
  EXPECT_EQ(d.data.order, data::Order::kFeistel);
  EXPECT_EQ(parse_config("", "x", {"data.kind=tokens"}).eval.max_batches, 20);
  EXPECT_EQ(parse_config("", "x", {"data.kind=tokens", "eval.max_batches=0"}).eval.max_batches, 0);
  // Both names in one text; bad values.
  std::string e = error_of("[data]\neval_batch_size = 8\n[eval]\nbatch_size = 8\n");
  EXPECT_NE(e.find("sets both data.eval_batch_size and eval.batch_size"), std::string::npos) << e;
  e = error_of("[eval]\nmax_batches = -1\n");
  EXPECT_NE(e.find("eval.max_batches"), std::string::npos) << e;
  e = error_of("[eval]\nbatch_size = 99999999\n");
  EXPECT_NE(e.find("eval.batch_size"), std::string::npos) << e;
  // The plan: at most max_batches batches of the batch size, the last one shorter.
  d.eval.batch_size = 30;
  d.eval.max_batches = 3;
  EXPECT_EQ(eval_plan(d, 1000).samples, 90);
  EXPECT_EQ(eval_plan(d, 70).batches, 3);
  EXPECT_EQ(eval_plan(d, 70).samples, 70);
  d.eval.max_batches = 0;
  EXPECT_EQ(eval_plan(d, 1000).batches, 34);
}

TEST(Config, UnknownKeyNamesKeyAndValidChoices) {
  std::string e = error_of("[optim]\nlearning_rate = 0.1\n");
  EXPECT_NE(e.find("unknown config key 'optim.learning_rate'"), std::string::npos) << e;
  EXPECT_NE(e.find("optim.lr"), std::string::npos) << e;
  e = error_of("", {"optim.lrr=1"});
  EXPECT_NE(e.find("optim.lrr"), std::string::npos) << e;
  e = error_of("[nonsense]\na = 1\n");
  EXPECT_NE(e.find("[nonsense]"), std::string::npos) << e;
}

TEST(Config, NumericsVersionTwoIsPortableWithOneThreadKnob) {
  Config v2 = parse_config("", "x", {"runtime.numerics_version=2", "runtime.threads=5"});
  EXPECT_EQ(v2.runtime.numerics_version, 2);
  EXPECT_EQ(v2.runtime.threads, 5);
  // Auto (0) resolves as the config is read, and the text holds the resolved value: 2 under
  // portable (the default), 1 under native, where the version does not apply.
  const Config fresh = parse_config("", "x", {});
  EXPECT_EQ(fresh.runtime.numerics_version, 2);
  EXPECT_NE(to_toml(fresh).find("numerics_version = 2"), std::string::npos);
  EXPECT_EQ(numerics_version(Config{}.runtime), 2);  // a config built in code, not yet resolved
  const Config native = parse_config("", "x", {"runtime.numerics=native"});
  EXPECT_EQ(native.runtime.numerics_version, 1);
  EXPECT_EQ(to_toml(native).find("numerics_version"), std::string::npos);
  EXPECT_EQ(parse_config(to_toml(native), "again", {}, ConfigSource::kRecorded).runtime.numerics_version, 1);
  std::string e = error_of("", {"runtime.numerics_version=2", "runtime.numerics=native"});
  EXPECT_NE(e.find("numerics_version = 2 is a version of the portable profile"), std::string::npos) << e;
  e = error_of("", {"runtime.numerics_version=2", "runtime.blas_threads=2"});
  EXPECT_NE(e.find("runtime.blas_threads = 2 is set; remove it and set runtime.threads"), std::string::npos) << e;
  EXPECT_NE(e.find("--set runtime.numerics_version=1"), std::string::npos) << e;
  e = error_of("", {"runtime.numerics_version=2", "runtime.elementwise_threads=1"});
  EXPECT_NE(e.find("runtime.elementwise_threads = 1 is set"), std::string::npos) << e;
  e = error_of("", {"runtime.numerics_version=3"});
  EXPECT_NE(e.find("runtime.numerics_version"), std::string::npos) << e;
  // Version 1 keeps its knobs.
  EXPECT_EQ(parse_config("", "x", {"runtime.numerics_version=1", "runtime.blas_threads=2"}).runtime.blas_threads, 2);
}

TEST(Config, AdamwLerpMomentNeedsLibTorchsAdamW) {
  EXPECT_EQ(parse_config("", "x", {}).optim.adamw_moment, AdamwMoment::kMulAdd);
  const Config c = parse_config("", "x", {"optim.adamw_moment=lerp", "optim.fused=false"});
  EXPECT_EQ(c.optim.adamw_moment, AdamwMoment::kLerp);
  std::string e = error_of("", {"optim.adamw_moment=lerp"});  // fused by default
  EXPECT_NE(e.find("needs optim.name = \"adamw\" and optim.fused = false"), std::string::npos) << e;
  e = error_of("", {"optim.adamw_moment=lerp", "optim.fused=false", "optim.name=sgd"});
  EXPECT_NE(e.find("optim.adamw_moment"), std::string::npos) << e;
}

TEST(Config, BadValuesNameKeyAndRange) {
  std::string e = error_of("[optim]\nname = \"adam\"\n");
  EXPECT_NE(e.find("optim.name"), std::string::npos) << e;
  EXPECT_NE(e.find("\"adamw\", \"sgd\""), std::string::npos) << e;
  e = error_of("", {"train.max_norm=-1"});
  EXPECT_NE(e.find("train.max_norm"), std::string::npos) << e;
  e = error_of("", {"data.batch_size=\"big\""});
  EXPECT_NE(e.find("expected integer"), std::string::npos) << e;
  e = error_of("", {"model.dropout=1.0"});
  EXPECT_NE(e.find("model.dropout"), std::string::npos) << e;
  e = error_of("seed = \n");
  EXPECT_NE(e.find("cannot parse test.toml at line 1"), std::string::npos) << e;
  e = error_of("", {"amp.growth_factor=1.0"});
  EXPECT_NE(e.find("amp.growth_factor"), std::string::npos) << e;
  e = error_of("", {"amp.backoff_factor=1.5"});
  EXPECT_NE(e.find("amp.backoff_factor"), std::string::npos) << e;
  e = error_of("", {"amp.backoff_factor=0"});
  EXPECT_NE(e.find("amp.backoff_factor"), std::string::npos) << e;
  e = error_of("", {"amp.mode=fp16"});
  EXPECT_NE(e.find("amp.mode"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16"), std::string::npos) << e;
  e = error_of("", {"faults.inject=\"nan-loss@x\""});
  EXPECT_NE(e.find("nan-loss@x"), std::string::npos) << e;
  e = error_of("", {"faults.inject=\"melt@3\""});
  EXPECT_NE(e.find("unknown kind"), std::string::npos) << e;
  e = error_of("", {"noequals"});
  EXPECT_NE(e.find("key=value"), std::string::npos) << e;
}

}  // namespace
TEST(Config, EntriesTrackSections) {
  const auto m = config_entries("# c\ntop = 1\n[a]\nx = \"v = w\"\n[a.b]\n y=2 \n\nnot a key\n");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at("top"), "1");
  EXPECT_EQ(m.at("a.x"), "\"v = w\"");
  EXPECT_EQ(m.at("a.b.y"), "2");
}

}  // namespace retrace::train

namespace retrace::train {
namespace {

// Findings of tools/fuzz/config_fuzzer.cpp: a float where an integer belongs is a type error before
// toml++ converts it (its value<int64_t>() casts 1e25 unchecked), and a --set value taken as a bare
// string must be UTF-8 (or the config written back would not read back as the same text).
TEST(Config, FuzzFindingsAreConfigErrors) {
  EXPECT_THROW(parse_config("seed = 999999999999999999e7\n", "x", {}), ConfigError);
  EXPECT_THROW(parse_config("", "x", {"seed=1e25"}), ConfigError);
  EXPECT_THROW(parse_config("[data]\nbatch_size = 1.0e30\n", "x", {}), ConfigError);
  EXPECT_THROW(parse_config("", "x", {"model.kind=\x84\x84gpt"}), ConfigError);
  EXPECT_THROW(parse_config("", "x", {"data.dir=/data/\xed\xa0\x80"}), ConfigError);  // a surrogate
  EXPECT_THROW(parse_config("", "x", {"data.dir=/data/\xc0\xaf"}), ConfigError);      // overlong '/'
  const Config c = parse_config("", "x", {"data.dir=/données/ｔｏｋｅｎｓ"});
  EXPECT_EQ(to_toml(parse_config(to_toml(c), "again", {})), to_toml(c));
  // The config fuzzer's hour (2026-12-04): a [user] key "l.kuLt .eind" from --set was written as
  // `l.kuLt .eind = ...` and read back as l.kuLt.eind, another text and config hash. Keys of [user]
  // are bare TOML keys joined by dots, from --set and from a file.
  try {
    parse_config("", "x", {"user.l.kuLt .eind=1"});
    ADD_FAILURE() << "a user key with a space was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("keys of [user] are bare TOML keys"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config("[user]\n\"a b\" = 1\n", "x", {}), ConfigError);
  EXPECT_THROW(parse_config("[user]\n\"\" = 1\n", "x", {}), ConfigError);
  EXPECT_THROW(parse_config("", "x", {"user.a..b=1"}), ConfigError);
  EXPECT_THROW(parse_config("", "x", {"user.a\x08=1"}), ConfigError);
  const Config u = parse_config("[user]\nteam.run-id = 'x'\n", "x", {"user.my_key.v-2=3"});
  EXPECT_EQ(u.user.count("team.run-id"), 1u);
  EXPECT_EQ(u.user.at("my_key.v-2"), "3");
  EXPECT_EQ(to_toml(parse_config(to_toml(u), "again", {})), to_toml(u));
}

}  // namespace
}  // namespace retrace::train
