#include "replay/diff.h"

#include "records/step_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "train/config.h"

namespace retrace::replay {
namespace {

using records::EvalRecord;
using records::EventRecord;
using records::StepRecord;

std::string fmt(double v, const char* spec = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

// Keyed values of both sides -> the keys whose values differ or exist on one side, by key.
std::vector<ValueDiff> diff_maps(const std::map<std::string, std::string>& a,
                                 const std::map<std::string, std::string>& b) {
  std::vector<ValueDiff> out;
  auto ia = a.begin();
  auto ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back({ia->first, ia->second, std::nullopt});
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back({ib->first, std::nullopt, ib->second});
      ++ib;
    } else {
      if (ia->second != ib->second) out.push_back({ia->first, ia->second, ib->second});
      ++ia;
      ++ib;
    }
  }
  return out;
}

std::map<std::string, std::string> fingerprint_map(const std::vector<records::KeyValue>& kvs) {
  std::map<std::string, std::string> m;
  for (const auto& kv : kvs)
    if (records::is_numerics_key(kv.key)) m[kv.key] = kv.value;
  return m;
}

std::string shape_text(const records::ParamInfo& p) {
  std::string s = "[";
  for (size_t i = 0; i < p.shape.size(); ++i) s += (i ? "," : "") + std::to_string(p.shape[i]);
  return s + "] " + p.dtype;
}

bool same_double(double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y)); }

// Later records of the same step win (the run after a rollback), as in compare_steps.
template <typename R>
std::map<uint64_t, const R*> by_step(const std::vector<R>& v) {
  std::map<uint64_t, const R*> m;
  for (const auto& r : v) m[r.step] = &r;
  return m;
}

std::optional<StepSpan> span_of(const std::vector<uint64_t>& sorted_steps) {
  if (sorted_steps.empty()) return std::nullopt;
  return StepSpan{sorted_steps.front(), sorted_steps.back(), sorted_steps.size()};
}

// Maximal runs of consecutive numbers in a sorted list.
std::vector<StepSpan> runs_of(const std::vector<uint64_t>& sorted_steps) {
  std::vector<StepSpan> out;
  for (uint64_t s : sorted_steps) {
    if (!out.empty() && out.back().last + 1 == s) {
      out.back().last = s;
      out.back().count++;
    } else {
      out.push_back({s, s, 1});
    }
  }
  return out;
}

std::string span_text(const StepSpan& s) {
  if (s.first == s.last) return "step " + std::to_string(s.first);
  std::string t = "steps " + std::to_string(s.first) + ".." + std::to_string(s.last);
  if (s.count != s.last - s.first + 1) t += " (" + std::to_string(s.count) + " steps)";
  return t;
}

std::string spans_text(const std::vector<StepSpan>& spans, size_t limit = 4) {
  std::string t;
  uint64_t total = 0;
  for (const auto& s : spans) total += s.count;
  for (size_t i = 0; i < spans.size() && i < limit; ++i)
    t += (i ? ", " : "") + (spans[i].first == spans[i].last
                                ? std::to_string(spans[i].first)
                                : std::to_string(spans[i].first) + ".." + std::to_string(spans[i].last));
  if (spans.size() > limit) t += ", ...";
  return t + " (" + std::to_string(total) + (total == 1 ? " step)" : " steps)");
}

// A table for people: columns padded to their widest cell, cells cut to a maximum width.
class TextTable {
 public:
  explicit TextTable(std::string indent, size_t max_cell = 44) : indent_(std::move(indent)), max_cell_(max_cell) {}
  void row(std::vector<std::string> cells) {
    for (auto& c : cells)
      if (c.size() > max_cell_) c = c.substr(0, max_cell_ - 3) + "...";
    rows_.push_back(std::move(cells));
  }
  void render(std::ostringstream& out) const {
    std::vector<size_t> w;
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) {
        if (w.size() <= i) w.push_back(0);
        w[i] = std::max(w[i], r[i].size());
      }
    for (const auto& r : rows_) {
      std::string line = indent_;
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
      }
      out << trim_right(line) << "\n";
    }
  }

 private:
  static std::string trim_right(std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  }
  std::string indent_;
  size_t max_cell_;
  std::vector<std::vector<std::string>> rows_;
};

constexpr size_t kTextListLimit = 20;

std::string side(const std::optional<std::string>& v) { return v ? *v : "(absent)"; }

std::string joined(const std::vector<std::string>& v) {
  if (v.empty()) return "(none)";
  std::string s;
  for (const auto& m : v) s += (s.empty() ? "" : " | ") + m;
  return s;
}

nlohmann::json opt_json(const std::optional<std::string>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json num_json(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json span_json(const std::optional<StepSpan>& s) {
  if (!s) return nullptr;
  return {{"first", s->first}, {"last", s->last}, {"count", s->count}};
}

nlohmann::json spans_json(const std::vector<StepSpan>& v) {
  auto j = nlohmann::json::array();
  for (const auto& s : v) j.push_back(span_json(s));
  return j;
}

nlohmann::json value_diffs_json(const std::vector<ValueDiff>& v) {
  auto j = nlohmann::json::array();
  for (const auto& d : v) j.push_back({{"key", d.key}, {"a", opt_json(d.a)}, {"b", opt_json(d.b)}});
  return j;
}

nlohmann::json field_json(const FieldDiff& f) { return {{"step", f.step}, {"field", f.field}, {"a", f.a}, {"b", f.b}}; }

nlohmann::json eval_json(const std::optional<EvalRecord>& e) {
  if (!e) return nullptr;
  return {{"epoch", e->epoch},         {"samples", e->samples},
          {"loss", num_json(e->loss)}, {"accuracy", num_json(e->accuracy)},
          {"tokens", e->tokens},       {"perplexity", num_json(e->perplexity())}};
}

}  // namespace

std::vector<const FieldDiff*> fields_by_step(const DiffReport& r) {
  std::vector<const FieldDiff*> v;
  for (const auto& [name, f] : r.first_by_field) v.push_back(&f);
  std::sort(v.begin(), v.end(), [](const FieldDiff* x, const FieldDiff* y) {
    return std::make_tuple(x->step, records::step_field_index(x->field), x->field) <
           std::make_tuple(y->step, records::step_field_index(y->field), y->field);
  });
  return v;
}

const char* outcome_name(records::Outcome o) { return records::outcome_text(o); }

bool EvalRow::differs() const {
  if (!a || !b) return true;
  return !same_double(a->loss, b->loss) || !same_double(a->accuracy, b->accuracy) || a->samples != b->samples ||
         a->tokens != b->tokens;
}

bool DiffReport::identical() const {
  // A run's process events (a resume, a crash, a checkpoint) are listed but change no bit of its
  // training: a resumed run is identical to the uninterrupted one.
  const bool training_events_differ = std::any_of(events.begin(), events.end(), [](const EventDiff& e) {
    return !records::is_process_event({e.step, e.kind, ""});
  });
  if (!header.empty() || !steps.equal() || training_events_differ) return false;
  return std::none_of(evals.begin(), evals.end(), [](const EvalRow& e) { return e.differs(); });
}

std::vector<ValueDiff> diff_fingerprints(const std::vector<records::KeyValue>& a,
                                         const std::vector<records::KeyValue>& b) {
  return diff_maps(fingerprint_map(a), fingerprint_map(b));
}

void for_each_header_diff(const HeaderDiff& h, const std::function<void(const char* part, const ValueDiff&)>& fn) {
  const std::pair<const char*, const std::vector<ValueDiff>*> parts[] = {{"config", &h.config},
                                                                         {"environment", &h.fingerprint},
                                                                         {"model", &h.model},
                                                                         {"data", &h.data_files},
                                                                         {"fault", &h.faults},
                                                                         {"header", &h.other}};
  for (const auto& [part, list] : parts)
    for (const auto& d : *list) fn(part, d);
}

HeaderDiff diff_headers(const records::TraceHeader& a, const records::TraceHeader& b) {
  HeaderDiff d;
  d.config = diff_maps(train::config_entries(a.config_toml), train::config_entries(b.config_toml));
  d.fingerprint = diff_fingerprints(a.fingerprint, b.fingerprint);

  std::map<std::string, std::string> ma, mb;
  if (a.model_description != b.model_description)
    d.model.push_back({"description", a.model_description, b.model_description});
  for (const auto& p : a.params) ma["param " + p.name] = shape_text(p);
  for (const auto& p : b.params) mb["param " + p.name] = shape_text(p);
  for (auto& v : diff_maps(ma, mb)) d.model.push_back(std::move(v));

  ma.clear(), mb.clear();
  for (const auto& f : a.data_files) ma[f.path] = f.sha256 + " (" + std::to_string(f.size) + " bytes)";
  for (const auto& f : b.data_files) mb[f.path] = f.sha256 + " (" + std::to_string(f.size) + " bytes)";
  d.data_files = diff_maps(ma, mb);

  ma.clear(), mb.clear();
  for (const auto& f : a.faults) ma[f.kind + "@" + std::to_string(f.step)] = f.arg;
  for (const auto& f : b.faults) mb[f.kind + "@" + std::to_string(f.step)] = f.arg;
  d.faults = diff_maps(ma, mb);

  auto other = [&](const char* key, const std::string& va, const std::string& vb) {
    if (va != vb) d.other.push_back({key, va, vb});
  };
  other("schema", a.schema, b.schema);
  other("retrace_version", a.retrace_version, b.retrace_version);
  other("seed", std::to_string(a.seed), std::to_string(b.seed));
  other("world_size", std::to_string(a.world_size), std::to_string(b.world_size));
  other("total_steps", std::to_string(a.total_steps), std::to_string(b.total_steps));
  return d;
}

std::optional<StepDivergence> locate_divergence(const StepRecord& a, const StepRecord& b) {
  const std::vector<FieldDiff> fields = diff_record(a, b, CompareMode::kBitwise, ToleranceRule{0.0});
  if (fields.empty()) return std::nullopt;
  // The earliest phase of the step that decides a differing field (records/step_fields.h); the
  // rest of the state when none does.
  using records::StepPhase;
  StepPhase earliest = StepPhase::kState;
  for (const FieldDiff& f : fields) {
    const size_t i = records::step_field_index(f.field);
    if (i < records::step_fields().size()) {
      const StepPhase p = records::step_fields()[i].phase;
      if (p != StepPhase::kNone && p < earliest) earliest = p;
    }
  }
  StepDivergence d;
  d.step = a.step;
  d.phase = earliest == StepPhase::kData        ? "data"
            : earliest == StepPhase::kForward   ? "forward"
            : earliest == StepPhase::kBackward  ? "backward"
            : earliest == StepPhase::kOptimizer ? "optimizer"
                                                : "state";
  if (!a.module_digests.empty() && !b.module_digests.empty()) {
    std::map<std::string, const records::ModuleDigest*> other;
    for (const auto& m : b.module_digests) other[m.module] = &m;
    d.modules = a.module_digests.size();
    for (const auto& m : a.module_digests) {
      auto it = other.find(m.module);
      std::vector<std::string> parts;
      if (it == other.end()) {
        parts = {"param", "grad", "optim"};  // the module exists in one model only
      } else {
        if (m.param != it->second->param) parts.push_back("param");
        if (m.grad != it->second->grad) parts.push_back("grad");
        if (m.optim != it->second->optim) parts.push_back("optim");
      }
      if (parts.empty()) continue;
      if (++d.modules_differing == 1) {
        d.module = m.module.empty() ? "(the model's own tensors)" : m.module;
        d.parts = std::move(parts);
      }
    }
  }
  return d;
}

std::string divergence_text(const StepDivergence& d) {
  std::string s = "step " + std::to_string(d.step) + ", phase " + d.phase;
  if (!d.module.empty()) {
    s += ", module " + d.module + " (";
    for (size_t i = 0; i < d.parts.size(); ++i) s += (i ? ", " : "") + d.parts[i];
    s += "; " + std::to_string(d.modules_differing) + " of " + std::to_string(d.modules) + " modules differ)";
  }
  return s;
}

DiffReport diff_traces(const trace::TraceReader& a, const trace::TraceReader& b) {
  DiffReport r;
  r.path_a = a.path();
  r.path_b = b.path();
  r.tail_warning_a = a.tail_warning();
  r.tail_warning_b = b.tail_warning();
  r.header = diff_headers(a.header(), b.header());

  const std::vector<StepRecord> steps_a = a.steps(), steps_b = b.steps();
  r.steps = compare_steps(steps_a, steps_b, CompareMode::kBitwise);

  const auto ma = by_step(steps_a), mb = by_step(steps_b);
  std::vector<uint64_t> all_a, all_b, common, only_a, only_b;
  for (const auto& [s, rec] : ma) {
    all_a.push_back(s);
    (mb.count(s) ? common : only_a).push_back(s);
  }
  for (const auto& [s, rec] : mb) {
    all_b.push_back(s);
    if (!ma.count(s)) only_b.push_back(s);
  }
  r.span_a = span_of(all_a);
  r.span_b = span_of(all_b);
  r.common = span_of(common);
  r.only_in_a = runs_of(only_a);
  r.only_in_b = runs_of(only_b);

  for (uint64_t s : common) {
    const StepRecord& ra = *ma.at(s);
    const StepRecord& rb = *mb.at(s);
    for (auto& f : diff_record(ra, rb, CompareMode::kBitwise, ToleranceRule{0.0}))
      r.first_by_field.emplace(f.field, std::move(f));  // keeps the first (earliest) entry
    if (!r.where && r.steps.first_diff && r.steps.first_diff->step == s) r.where = locate_divergence(ra, rb);
    if (ra.outcome != rb.outcome) r.skips.push_back({s, ra.outcome, rb.outcome, ra.skip_reason, rb.skip_reason});
  }

  // Events grouped by (step, kind), messages in file order.
  using Key = std::pair<uint64_t, std::string>;
  std::map<Key, std::vector<std::string>> ea, eb;
  for (const auto& e : a.events()) ea[{e.step, e.kind}].push_back(e.message);
  for (const auto& e : b.events()) eb[{e.step, e.kind}].push_back(e.message);
  std::map<Key, int> keys;
  for (const auto& [k, v] : ea) keys[k] = 0;
  for (const auto& [k, v] : eb) keys[k] = 0;
  for (const auto& [k, unused] : keys) {
    auto ia = ea.find(k);
    auto ib = eb.find(k);
    std::vector<std::string> va = ia == ea.end() ? std::vector<std::string>{} : ia->second;
    std::vector<std::string> vb = ib == eb.end() ? std::vector<std::string>{} : ib->second;
    if (va != vb) r.events.push_back({k.first, k.second, std::move(va), std::move(vb)});
  }

  const std::vector<EvalRecord> evals_a = a.evals(), evals_b = b.evals();
  const auto va = by_step(evals_a), vb = by_step(evals_b);
  std::map<uint64_t, EvalRow> rows;
  for (const auto& [s, e] : va) rows[s].a = *e;
  for (const auto& [s, e] : vb) rows[s].b = *e;
  for (auto& [s, row] : rows) {
    row.step = s;
    r.evals.push_back(row);
  }
  return r;
}

namespace {

// The text report's summary table: the runs and their spans, the verdict, the loss difference,
// the environment.
TextTable text_summary(const DiffReport& r) {
  auto span_or_none = [](const std::optional<StepSpan>& s) { return s ? span_text(*s) : std::string("no steps"); };
  // Summary cells hold sentences and paths: cut them late.
  TextTable sum("", 160);
  sum.row({"a", r.path_a + "  " + span_or_none(r.span_a)});
  sum.row({"b", r.path_b + "  " + span_or_none(r.span_b)});
  if (r.tail_warning_a) sum.row({"warning", "a: " + *r.tail_warning_a});
  if (r.tail_warning_b) sum.row({"warning", "b: " + *r.tail_warning_b});
  sum.row({"common", r.common ? span_text(*r.common) + ", " + std::to_string(r.steps.compared) + " compared"
                              : std::string("no common steps")});
  if (!r.only_in_a.empty()) sum.row({"only in a", spans_text(r.only_in_a)});
  if (!r.only_in_b.empty()) sum.row({"only in b", spans_text(r.only_in_b)});
  std::string verdict;
  if (r.identical()) verdict = "IDENTICAL (bitwise)";
  else if (r.steps.first_diff)
    verdict = "DIVERGED at step " + std::to_string(r.steps.first_diff->step) + " (" + r.steps.first_diff->field + ")";
  else if (r.steps.compared > 0) verdict = "common steps equal (bitwise); other differences below";
  else verdict = "nothing to compare step by step";
  sum.row({"verdict", verdict});
  if (r.where) sum.row({"where", divergence_text(*r.where)});
  if (r.steps.compared > 0)
    sum.row({"loss diff", "max " + fmt(r.steps.max_loss_diff) + " at step " +
                              std::to_string(r.steps.max_loss_diff_step) + ", final " + fmt(r.steps.final_loss_diff)});
  std::string env = "equal";
  if (r.environment_differs()) {
    env = "differs (bitwise differences are expected):";
    for (const auto& d : r.header.fingerprint) env += " " + d.key;
  }
  sum.row({"environment", env});
  if (r.models_differ()) sum.row({"model", "differs (see below)"});
  return sum;
}

// The text report's lists of skipped steps, events and evaluations that differ, each cut at
// kTextListLimit rows.
void text_lists(std::ostringstream& out, const DiffReport& r) {
  auto section = [&](const char* title) { out << "\n" << title << "\n"; };
  if (!r.skips.empty()) {
    section("skipped steps (SKIP in one, STEP in the other)");
    TextTable t("  ");
    t.row({"step", "a", "b"});
    for (size_t i = 0; i < r.skips.size() && i < kTextListLimit; ++i) {
      const auto& s = r.skips[i];
      auto cell = [](records::Outcome o, const std::string& reason) {
        return std::string(outcome_name(o)) + (reason.empty() ? "" : " " + reason);
      };
      t.row({std::to_string(s.step), cell(s.a, s.reason_a), cell(s.b, s.reason_b)});
    }
    t.render(out);
    if (r.skips.size() > kTextListLimit) out << "  ... " << r.skips.size() - kTextListLimit << " more\n";
  }

  if (!r.events.empty()) {
    section("event differences");
    TextTable t("  ");
    t.row({"step", "kind", "a", "b"});
    for (size_t i = 0; i < r.events.size() && i < kTextListLimit; ++i) {
      const auto& e = r.events[i];
      t.row({std::to_string(e.step), e.kind, joined(e.a), joined(e.b)});
    }
    t.render(out);
    if (r.events.size() > kTextListLimit) out << "  ... " << r.events.size() - kTextListLimit << " more\n";
  }

  size_t differing_evals = 0;
  for (const auto& e : r.evals) differing_evals += e.differs();
  if (differing_evals > 0) {
    section("evaluation differences");
    TextTable t("  ");
    t.row({"step", "accuracy a", "accuracy b", "loss a", "loss b", "perplexity a", "perplexity b"});
    size_t shown = 0;
    for (const auto& e : r.evals) {
      if (!e.differs() || shown++ >= kTextListLimit) continue;
      auto acc = [](const std::optional<EvalRecord>& x) { return x ? fmt(x->accuracy, "%.4f") : std::string("-"); };
      auto loss = [](const std::optional<EvalRecord>& x) { return x ? fmt(x->loss) : std::string("-"); };
      auto ppl = [](const std::optional<EvalRecord>& x) {
        return x && x->language_model() ? fmt(x->perplexity(), "%.4f") : std::string("-");
      };
      t.row({std::to_string(e.step), acc(e.a), acc(e.b), loss(e.a), loss(e.b), ppl(e.a), ppl(e.b)});
    }
    t.render(out);
    if (differing_evals > kTextListLimit) out << "  ... " << differing_evals - kTextListLimit << " more\n";
  }
}

}  // namespace

std::string render_text(const DiffReport& r) {
  std::ostringstream out;
  TextTable sum = text_summary(r);
  out << "diff\n";
  sum.render(out);

  auto section = [&](const char* title) { out << "\n" << title << "\n"; };
  if (!r.header.empty()) {
    section("header differences");
    TextTable t("  ");
    t.row({"part", "key", "a", "b"});
    for_each_header_diff(r.header, [&](const char* part, const ValueDiff& d) {
      t.row({part, d.key, side(d.a), side(d.b)});
    });
    t.render(out);
  }

  if (!r.first_by_field.empty()) {
    section("first divergence per field");
    TextTable t("  ", 36);
    t.row({"step", "field", "a", "b"});
    for (const auto* f : fields_by_step(r)) t.row({std::to_string(f->step), f->field, f->a, f->b});
    t.render(out);
  }

  text_lists(out, r);
  return out.str();
}

nlohmann::json to_json(const DiffReport& r) {
  nlohmann::json j;
  j["a"] = {{"path", r.path_a}, {"steps", span_json(r.span_a)}, {"tail_warning", opt_json(r.tail_warning_a)}};
  j["b"] = {{"path", r.path_b}, {"steps", span_json(r.span_b)}, {"tail_warning", opt_json(r.tail_warning_b)}};
  j["identical"] = r.identical();
  j["models_differ"] = r.models_differ();
  j["environment_differs"] = r.environment_differs();
  j["header"] = {{"config", value_diffs_json(r.header.config)}, {"fingerprint", value_diffs_json(r.header.fingerprint)},
                 {"model", value_diffs_json(r.header.model)},   {"data_files", value_diffs_json(r.header.data_files)},
                 {"faults", value_diffs_json(r.header.faults)}, {"other", value_diffs_json(r.header.other)}};
  j["steps"] = {{"compared", r.steps.compared},
                {"only_in_a", r.steps.only_in_a},
                {"only_in_b", r.steps.only_in_b},
                {"common", span_json(r.common)},
                {"only_in_a_ranges", spans_json(r.only_in_a)},
                {"only_in_b_ranges", spans_json(r.only_in_b)},
                {"max_loss_diff", num_json(r.steps.max_loss_diff)},
                {"max_loss_diff_step", r.steps.max_loss_diff_step},
                {"final_loss_diff", num_json(r.steps.final_loss_diff)},
                {"first_divergence", r.steps.first_diff ? field_json(*r.steps.first_diff) : nlohmann::json(nullptr)}};
  auto fields = nlohmann::json::object();
  for (const auto& [name, f] : r.first_by_field) fields[name] = field_json(f);
  j["first_divergence_by_field"] = fields;
  if (r.where)
    j["where"] = {{"step", r.where->step},
                  {"phase", r.where->phase},
                  {"module", r.where->module},
                  {"parts", r.where->parts},
                  {"modules_differing", r.where->modules_differing},
                  {"modules", r.where->modules}};
  else j["where"] = nullptr;
  auto skips = nlohmann::json::array();
  for (const auto& s : r.skips)
    skips.push_back({{"step", s.step},
                     {"a", outcome_name(s.a)},
                     {"b", outcome_name(s.b)},
                     {"reason_a", s.reason_a},
                     {"reason_b", s.reason_b}});
  j["skips"] = skips;
  auto events = nlohmann::json::array();
  for (const auto& e : r.events) events.push_back({{"step", e.step}, {"kind", e.kind}, {"a", e.a}, {"b", e.b}});
  j["events"] = events;
  auto evals = nlohmann::json::array();
  for (const auto& e : r.evals)
    evals.push_back({{"step", e.step}, {"a", eval_json(e.a)}, {"b", eval_json(e.b)}, {"differs", e.differs()}});
  j["evals"] = evals;
  return j;
}

}  // namespace retrace::replay
