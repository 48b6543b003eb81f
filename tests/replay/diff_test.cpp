#include "replay/diff.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "replay/diff_test_util.h"
#include "replay/html_report.h"
#include "testing/temp_dir.h"
#include "trace/trace_reader.h"

namespace retrace::replay {
namespace {

using testing::demo_header;
using testing::demo_step;
using testing::demo_steps;
using testing::write_trace;
using trace::TraceReader;

struct Pair {
  retrace::testing::TempDir dir;
  std::string a = dir.file("a.rtrace");
  std::string b = dir.file("b.rtrace");
};

bool has_key(const std::vector<ValueDiff>& v, const std::string& key) {
  for (const auto& d : v)
    if (d.key == key) return true;
  return false;
}

TEST(Diff, IdenticalTracesHaveNoDivergence) {
  Pair p;
  write_trace(p.a, demo_header(), demo_steps(20), {{10, 0, 1000, 0.5, 0.81}}, {{4, "warning", "w"}});
  write_trace(p.b, demo_header(), demo_steps(20), {{10, 0, 1000, 0.5, 0.81}}, {{4, "warning", "w"}});
  const auto ra = TraceReader::open(p.a), rb = TraceReader::open(p.b);
  const DiffReport r = diff_traces(ra, rb);
  EXPECT_TRUE(r.identical());
  EXPECT_FALSE(r.first_divergent_step());
  EXPECT_TRUE(r.first_by_field.empty());
  EXPECT_TRUE(r.header.empty());
  EXPECT_EQ(r.steps.compared, 20u);
  ASSERT_TRUE(r.common);
  EXPECT_EQ(r.common->first, 1u);
  EXPECT_EQ(r.common->last, 20u);
  EXPECT_EQ(r.steps.max_loss_diff, 0.0);
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_FALSE(r.evals[0].differs());
  EXPECT_NE(render_text(r).find("IDENTICAL"), std::string::npos);
  EXPECT_TRUE(to_json(r)["identical"].get<bool>());
}

TEST(Diff, ChangedLossAtStep7IsTheFirstDivergence) {
  Pair p;
  auto steps = demo_steps(20);
  testing::set_loss(steps[6], steps[6].loss + 0.25);
  ASSERT_EQ(steps[6].step, 7u);
  write_trace(p.a, demo_header(), demo_steps(20));
  write_trace(p.b, demo_header(), steps);
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  EXPECT_FALSE(r.identical());
  ASSERT_TRUE(r.first_divergent_step());
  EXPECT_EQ(*r.first_divergent_step(), 7u);
  EXPECT_EQ(r.steps.first_diff->field, "loss");
  ASSERT_TRUE(r.first_by_field.count("loss"));
  EXPECT_EQ(r.first_by_field.at("loss").step, 7u);
  ASSERT_TRUE(r.first_by_field.count("chain_digest"));
  EXPECT_EQ(r.first_by_field.at("chain_digest").step, 7u);  // the chain carries the change onward
  EXPECT_FALSE(r.first_by_field.count("param_digest"));
  EXPECT_NEAR(r.steps.max_loss_diff, 0.25, 1e-12);
  EXPECT_EQ(r.steps.max_loss_diff_step, 7u);
  EXPECT_EQ(r.steps.final_loss_diff, 0.0);
  EXPECT_TRUE(r.header.empty());
  const std::string text = render_text(r);
  EXPECT_NE(text.find("DIVERGED at step 7 (loss)"), std::string::npos) << text;
  const auto j = to_json(r);
  EXPECT_EQ(j["steps"]["first_divergence"]["step"], 7);
  EXPECT_EQ(j["first_divergence_by_field"]["loss"]["step"], 7);
}

// Where a step parts: the earliest phase whose fields differ and, from per-module digests, the
// first module in the model's order that differs.
TEST(Diff, WhereNamesThePhaseAndTheFirstDifferingModule) {
  Pair p;
  auto with_modules = [](std::vector<records::StepRecord> steps) {
    for (auto& r : steps)
      r.module_digests = {{"embed", {r.step, 1}, {r.step, 2}, {r.step, 3}},
                          {"blocks.1.attn", {r.step, 4}, {r.step, 5}, {r.step, 6}},
                          {"head", {r.step, 7}, {r.step, 8}, {r.step, 9}}};
    return steps;
  };
  auto base = with_modules(demo_steps(20));
  auto changed = base;
  // step 9: blocks.1.attn's and head's parameters (an optimizer difference), gradients equal
  changed[8].param_digest.lo ^= 1;
  changed[8].module_digests[1].param.lo ^= 1;
  changed[8].module_digests[2].param.lo ^= 1;
  changed[8].module_digests[2].optim.lo ^= 1;
  write_trace(p.a, demo_header(), base);
  write_trace(p.b, demo_header(), changed);
  DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_TRUE(r.where);
  EXPECT_EQ(r.where->step, 9u);
  EXPECT_EQ(r.where->phase, "optimizer");
  EXPECT_EQ(r.where->module, "blocks.1.attn");
  EXPECT_EQ(r.where->parts, std::vector<std::string>{"param"});
  EXPECT_EQ(r.where->modules_differing, 2u);
  EXPECT_EQ(r.where->modules, 3u);
  const std::string text = render_text(r);
  EXPECT_NE(text.find("step 9, phase optimizer, module blocks.1.attn (param; 2 of 3 modules differ)"),
            std::string::npos)
      << text;
  EXPECT_EQ(to_json(r)["where"]["module"], "blocks.1.attn");
  // The loss differs first: phase forward; gradients: backward; the batch: data.
  auto loss = base;
  testing::set_loss(loss[3], loss[3].loss + 1);
  EXPECT_EQ(locate_divergence(base[3], loss[3])->phase, "forward");
  auto grads = base;
  grads[3].grad_digest.hi ^= 1;
  grads[3].module_digests[0].grad.hi ^= 1;
  EXPECT_EQ(locate_divergence(base[3], grads[3])->phase, "backward");
  EXPECT_EQ(locate_divergence(base[3], grads[3])->module, "embed");
  auto data = grads;
  data[3].sample_digest.hi ^= 1;
  EXPECT_EQ(locate_divergence(base[3], data[3])->phase, "data");
  EXPECT_FALSE(locate_divergence(base[3], base[3]));
  // Without module digests on one side: the phase alone.
  auto plain = demo_steps(20);
  plain[3].param_digest.hi ^= 1;
  const auto d = locate_divergence(demo_steps(20)[3], plain[3]);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->phase, "optimizer");
  EXPECT_TRUE(d->module.empty());
}

TEST(Diff, PerFieldFirstDivergenceTracksEachField) {
  Pair p;
  auto steps = demo_steps(20);
  steps[11].lr = 2e-3;             // step 12
  steps[4].param_digest = {9, 9};  // step 5
  write_trace(p.a, demo_header(), demo_steps(20));
  write_trace(p.b, demo_header(), steps);
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  EXPECT_EQ(*r.first_divergent_step(), 5u);
  EXPECT_EQ(r.first_by_field.at("param_digest").step, 5u);
  EXPECT_EQ(r.first_by_field.at("lr").step, 12u);
  EXPECT_EQ(r.first_by_field.at("lr").b, "0.002");
}

TEST(Diff, ConfigDifferencesListKeysWithSections) {
  Pair p;
  auto hb = demo_header();
  hb.config_toml =
      "[run]\nseed = 7\nsteps = 200\n\n[optim]\nname = \"sgd\"\nlr = 0.001\nmomentum = "
      "0.9\n\n[model]\nhidden = [128]\n";
  write_trace(p.a, demo_header(), demo_steps(5));
  write_trace(p.b, hb, demo_steps(5));
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_EQ(r.header.config.size(), 2u);
  EXPECT_EQ(r.header.config[0].key, "optim.momentum");
  EXPECT_FALSE(r.header.config[0].a);
  EXPECT_EQ(*r.header.config[0].b, "0.9");
  EXPECT_EQ(r.header.config[1].key, "optim.name");
  EXPECT_EQ(*r.header.config[1].a, "\"adamw\"");
  EXPECT_FALSE(r.identical());
  EXPECT_FALSE(r.first_divergent_step());
  const std::string text = render_text(r);
  EXPECT_NE(text.find("optim.name"), std::string::npos) << text;
  EXPECT_NE(text.find("(absent)"), std::string::npos) << text;
}

TEST(Diff, FingerprintDifferencesIgnoreInfoKeys) {
  Pair p;
  auto hb = demo_header();
  hb.fingerprint = {{"libtorch", "2.4.0"},
                    {"blas", "openblas"},
                    {"threads", "1"},
                    {"info.host", "box-2"},
                    {"info.pid", "42"}};
  write_trace(p.a, demo_header(), demo_steps(5));
  write_trace(p.b, hb, demo_steps(5));
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_EQ(r.header.fingerprint.size(), 1u);
  EXPECT_EQ(r.header.fingerprint[0].key, "libtorch");
  EXPECT_TRUE(r.environment_differs());
  EXPECT_NE(render_text(r).find("bitwise differences are expected"), std::string::npos);

  // Only info.* differs: the environments are equal.
  Pair q;
  auto hc = demo_header();
  hc.fingerprint.back().value = "box-9";
  write_trace(q.a, demo_header(), demo_steps(5));
  write_trace(q.b, hc, demo_steps(5));
  const DiffReport r2 = diff_traces(TraceReader::open(q.a), TraceReader::open(q.b));
  EXPECT_TRUE(r2.header.fingerprint.empty());
  EXPECT_TRUE(r2.identical());
}

TEST(Diff, NumericsFieldsAreTheOnlyOnesThatCount) {
  using records::is_numerics_key;
  EXPECT_TRUE(is_numerics_key("blas_core"));
  EXPECT_TRUE(is_numerics_key("numerics"));
  EXPECT_TRUE(is_numerics_key("cpu_features"));  // native numerics: the features steer kernel choice
  EXPECT_FALSE(is_numerics_key("info.cpu_features"));
  EXPECT_FALSE(is_numerics_key("info.env.OPENBLAS_CORETYPE"));
  // Keys that traces made before the numerics profile recorded without "info." but that change no bits.
  EXPECT_FALSE(is_numerics_key("allocator"));
  EXPECT_FALSE(is_numerics_key("cuda_device_count"));
  EXPECT_FALSE(is_numerics_key("env.OPENBLAS_CORETYPE"));

  const std::vector<records::KeyValue> a = {{"numerics", "portable"},
                                            {"blas_core", "Haswell"},
                                            {"blas_threads", "2"},
                                            {"info.env.OPENBLAS_L2_SIZE", ""},
                                            {"info.host", "a"}};
  std::vector<records::KeyValue> b = a;
  b[3].value = "256";  // information only
  b[4].value = "b";
  EXPECT_TRUE(diff_fingerprints(a, b).empty());
  b[1].value = "Prescott";  // the kernel
  b[2].value = "1";         // the thread count
  const auto d = diff_fingerprints(a, b);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].key, "blas_core");
  EXPECT_EQ(d[1].key, "blas_threads");
  EXPECT_EQ(records::numerics_fields(a).size(), 3u);
  EXPECT_EQ(records::numerics_differences(a, b), (std::vector<std::string>{"blas_core", "blas_threads"}));
}

TEST(Compare, CrossNumericsRuleIsTightEarlyLooserLateAndExactOnTheSchedule) {
  const ToleranceRule rule{1e-4, 20, 0.02};
  EXPECT_EQ(rule.allowed(20, 2.0), 1e-4);
  EXPECT_DOUBLE_EQ(rule.allowed(21, 2.0), 0.04);
  EXPECT_EQ(rule.allowed(21, 0.001), 1e-4);  // never tighter than abs
  auto a = demo_steps(40);
  auto b = a;
  b[9].loss += 5e-5;                          // step 10: within 1e-4
  b[29].loss += 1e-2;                         // step 30: beyond 1e-4, but within 2 %
  for (auto& r : b) r.param_digest = {1, 2};  // digests are not compared across numerics
  CompareReport ok = compare_steps(a, b, CompareMode::kTolerance, rule);
  EXPECT_TRUE(ok.equal()) << ok.first_diff->field << " at " << ok.first_diff->step;
  auto c = b;
  c[4].loss += 2e-4;  // step 5: inside the horizon, beyond 1e-4
  CompareReport early = compare_steps(a, c, CompareMode::kTolerance, rule);
  ASSERT_TRUE(early.first_diff);
  EXPECT_EQ(early.first_diff->step, 5u);
  EXPECT_EQ(early.first_diff->field, "loss");
  auto d = b;
  d[32].lr *= 2;  // a schedule change shows whatever the numerics
  CompareReport lr = compare_steps(a, d, CompareMode::kTolerance, rule);
  ASSERT_TRUE(lr.first_diff);
  EXPECT_EQ(lr.first_diff->field, "lr");
  EXPECT_EQ(lr.first_diff->step, 33u);
}

TEST(Diff, DifferentModelsAreStillDiffable) {
  Pair p;
  auto hb = demo_header();
  hb.model_description = "mlp 784-256-10";
  hb.params = {{"fc1.weight", {256, 784}, "float32"}, {"fc1.bias", {256}, "float32"}, {"fc2.bias", {10}, "float32"}};
  hb.data_files[0].sha256 = "bb22";
  hb.faults = {{"nan-loss", 3, ""}};
  write_trace(p.a, demo_header(), demo_steps(5));
  write_trace(p.b, hb, demo_steps(5));
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  EXPECT_TRUE(r.models_differ());
  EXPECT_TRUE(has_key(r.header.model, "description"));
  EXPECT_TRUE(has_key(r.header.model, "param fc1.weight"));
  EXPECT_TRUE(has_key(r.header.model, "param fc2.bias"));
  ASSERT_EQ(r.header.data_files.size(), 1u);
  EXPECT_EQ(r.header.data_files[0].key, "data/train-images-idx3-ubyte");
  ASSERT_EQ(r.header.faults.size(), 1u);
  EXPECT_EQ(r.header.faults[0].key, "nan-loss@3");
  EXPECT_NE(render_text(r).find("model"), std::string::npos);
}

TEST(Diff, SkipDifferencesCarryReasons) {
  Pair p;
  auto steps = demo_steps(20);
  testing::make_skip(steps[9], "non_finite_loss");  // step 10
  write_trace(p.a, demo_header(), demo_steps(20));
  write_trace(p.b, demo_header(), steps);
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_EQ(r.skips.size(), 1u);
  EXPECT_EQ(r.skips[0].step, 10u);
  EXPECT_EQ(r.skips[0].a, records::Outcome::kStep);
  EXPECT_EQ(r.skips[0].b, records::Outcome::kSkip);
  EXPECT_EQ(r.skips[0].reason_b, "non_finite_loss");
  EXPECT_EQ(r.first_by_field.at("outcome").step, 10u);
  EXPECT_NE(render_text(r).find("SKIP non_finite_loss"), std::string::npos) << render_text(r);
}

TEST(Diff, DifferentLengthsReportCommonRangeAndExtraSteps) {
  Pair p;
  write_trace(p.a, demo_header(), demo_steps(30));
  write_trace(p.b, demo_header(), demo_steps(20));
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_TRUE(r.common);
  EXPECT_EQ(r.common->first, 1u);
  EXPECT_EQ(r.common->last, 20u);
  EXPECT_EQ(r.steps.compared, 20u);
  EXPECT_EQ(r.steps.only_in_a, 10u);
  ASSERT_EQ(r.only_in_a.size(), 1u);
  EXPECT_EQ(r.only_in_a[0].first, 21u);
  EXPECT_EQ(r.only_in_a[0].last, 30u);
  EXPECT_TRUE(r.only_in_b.empty());
  EXPECT_FALSE(r.first_divergent_step());
  EXPECT_FALSE(r.identical());
  const std::string text = render_text(r);
  EXPECT_NE(text.find("only in a"), std::string::npos) << text;
  EXPECT_NE(text.find("21..30"), std::string::npos) << text;
}

TEST(Diff, TraceWithoutStepsIsDiffable) {
  Pair p;
  write_trace(p.a, demo_header(), {});
  write_trace(p.b, demo_header(), demo_steps(5));
  const auto ra = TraceReader::open(p.a), rb = TraceReader::open(p.b);
  const DiffReport r = diff_traces(ra, rb);
  EXPECT_FALSE(r.span_a);
  EXPECT_FALSE(r.common);
  EXPECT_EQ(r.steps.only_in_b, 5u);
  EXPECT_NE(render_text(r).find("no common steps"), std::string::npos);
  EXPECT_NE(render_html(r, ra, rb, "a", "b").find("<svg"), std::string::npos);
  EXPECT_TRUE(to_json(r)["steps"]["common"].is_null());
}

TEST(Diff, EventAndEvalDifferences) {
  Pair p;
  write_trace(p.a, demo_header(), demo_steps(20), {{10, 0, 1000, 0.5, 0.81}, {20, 0, 1000, 0.4, 0.85}},
              {{8, "rollback", "spike at 8, back to 5"}});
  write_trace(p.b, demo_header(), demo_steps(20), {{10, 0, 1000, 0.5, 0.81}, {20, 0, 1000, 0.4, 0.86}},
              {{12, "resume", "from step 10"}});
  const DiffReport r = diff_traces(TraceReader::open(p.a), TraceReader::open(p.b));
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].step, 8u);
  EXPECT_EQ(r.events[0].kind, "rollback");
  EXPECT_TRUE(r.events[0].b.empty());
  EXPECT_EQ(r.events[1].kind, "resume");
  // A resume alone (a process event) leaves two runs identical; it is still listed.
  Pair q;
  write_trace(q.a, demo_header(), demo_steps(20));
  write_trace(q.b, demo_header(), demo_steps(20), {}, {{12, "resume", "from step 10"}});
  const DiffReport resumed = diff_traces(TraceReader::open(q.a), TraceReader::open(q.b));
  EXPECT_TRUE(resumed.identical());
  EXPECT_EQ(resumed.events.size(), 1u);
  ASSERT_EQ(r.evals.size(), 2u);
  EXPECT_FALSE(r.evals[0].differs());
  EXPECT_TRUE(r.evals[1].differs());
  const auto j = to_json(r);
  EXPECT_EQ(j["events"].size(), 2u);
  EXPECT_TRUE(j["evals"][1]["differs"].get<bool>());
}

TEST(Diff, HtmlIsSelfContainedWithChartsAndMarkers) {
  Pair p;
  auto steps = demo_steps(200);
  for (uint64_t s : {30u, 31u, 90u}) testing::make_skip(steps[s - 1], "non_finite_loss");
  for (size_t i = 119; i < steps.size(); ++i) testing::set_loss(steps[i], steps[i].loss * 1.05);
  write_trace(p.a, demo_header(), demo_steps(200));
  write_trace(p.b, demo_header(), steps, {}, {{60, "rollback", "spike"}, {150, "resume", "from 140"}});
  const auto ra = TraceReader::open(p.a), rb = TraceReader::open(p.b);
  const DiffReport r = diff_traces(ra, rb);
  const std::string html = render_html(r, ra, rb, "baseline-run", "candidate-run");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("baseline-run"), std::string::npos);
  EXPECT_NE(html.find("candidate-run"), std::string::npos);
  EXPECT_NE(html.find("class=\"divergence\""), std::string::npos);
  EXPECT_NE(html.find("first divergence: step 30"), std::string::npos);
  EXPECT_NE(html.find("b: SKIP at step 90"), std::string::npos);
  EXPECT_NE(html.find("b: rollback at step 60"), std::string::npos);
  EXPECT_NE(html.find("b: resume at step 150"), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
}

TEST(Diff, HtmlEscapesConfigValues) {
  Pair p;
  auto hb = demo_header();
  hb.config_toml += "[data]\nname = \"<script>alert('x') & \\\"y\\\"</script>\"\n";
  write_trace(p.a, demo_header(), demo_steps(5));
  write_trace(p.b, hb, demo_steps(5));
  const auto ra = TraceReader::open(p.a), rb = TraceReader::open(p.b);
  const DiffReport r = diff_traces(ra, rb);
  ASSERT_TRUE(has_key(r.header.config, "data.name"));
  const std::string html = render_html(r, ra, rb, "<a>", "b&b");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;) &amp; \\&quot;y\\&quot;&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<a>"), std::string::npos);
  EXPECT_NE(html.find("&lt;a&gt;"), std::string::npos);
  EXPECT_NE(html.find("b&amp;b"), std::string::npos);
  EXPECT_EQ(html_escape("<&>\"'"), "&lt;&amp;&gt;&quot;&#39;");
}

TEST(Diff, HtmlOfLongTracesStaysSmall) {
  Pair p;
  const uint64_t n = 100000;
  auto steps = demo_steps(n);
  for (uint64_t s = 1000; s < n; s += 97) testing::make_skip(steps[s - 1], "non_finite_loss");
  write_trace(p.a, demo_header(), demo_steps(n));
  write_trace(p.b, demo_header(), steps);
  const auto ra = TraceReader::open(p.a), rb = TraceReader::open(p.b);
  const DiffReport r = diff_traces(ra, rb);
  const std::string html = render_html(r, ra, rb, "a", "b");
  EXPECT_LT(html.size(), 600u * 1024) << "bytes: " << html.size();
  std::printf("html of %llu-step traces: %zu bytes\n", static_cast<unsigned long long>(n), html.size());
  EXPECT_NE(html.find("more rows"), std::string::npos);  // skip table is cut, the JSON has all
}

}  // namespace
}  // namespace retrace::replay
