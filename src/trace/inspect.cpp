#include "trace/inspect.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "records/step_fields.h"

namespace retrace::trace {
namespace {

using nlohmann::json;

// Digits enough to tell steps apart in a table; the JSON and CSV views carry the full digest.
constexpr size_t kDigestPrefix = 12;

std::string outcome_text(const records::StepRecord& r) {
  return r.outcome == records::Outcome::kSkip ? "SKIP:" + r.skip_reason : std::string("STEP");
}

// Shortest text that reads back to the same double, so the CSV view loses nothing.
std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string fixed(const char* fmt, double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

uint64_t param_count(const records::ParamInfo& p) {
  uint64_t n = 1;
  for (int64_t d : p.shape) n *= static_cast<uint64_t>(d < 0 ? 0 : d);
  return n;
}

json header_json(const records::TraceHeader& h) {
  json j;
  j["schema"] = h.schema;
  j["retrace_version"] = h.retrace_version;
  j["config_toml"] = h.config_toml;
  j["config_hash"] = h.config_hash;
  j["seed"] = h.seed;
  json fp = json::object();
  for (const records::KeyValue& kv : h.fingerprint) fp[kv.key] = kv.value;
  j["fingerprint"] = fp;
  j["model_description"] = h.model_description;
  json params = json::array();
  for (const records::ParamInfo& p : h.params) {
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype}});
  }
  j["params"] = params;
  json files = json::array();
  for (const records::FileInfo& f : h.data_files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  }
  j["data_files"] = files;
  json faults = json::array();
  for (const records::Fault& f : h.faults) faults.push_back({{"kind", f.kind}, {"step", f.step}, {"arg", f.arg}});
  j["faults"] = faults;
  j["total_steps"] = h.total_steps;
  j["effective_batch"] = h.effective_batch;
  j["world_size"] = h.world_size;
  j["created_utc"] = h.created_utc;
  return j;
}

// A field's value as JSON: digests as hex, the outcome as STEP or SKIP, module digests as objects.
json json_of(const Digest128& d) { return d.hex(); }
json json_of(records::Outcome o) { return records::outcome_text(o); }
json json_of(const records::ModuleDigest& m) {
  return {{"module", m.module}, {"param", m.param.hex()}, {"grad", m.grad.hex()}, {"optim", m.optim.hex()}};
}
json json_of(const records::Timings& t) {
  return {{"data_ms", t.data_ms},
          {"forward_ms", t.forward_ms},
          {"backward_ms", t.backward_ms},
          {"optimizer_ms", t.optimizer_ms},
          {"trace_ms", t.trace_ms},
          {"allreduce_ms", t.allreduce_ms},
          {"checkpoint_ms", t.checkpoint_ms}};
}
template <typename T>
json json_of(const T& v) {
  return v;
}
template <typename T>
json json_of(const std::vector<T>& v) {
  json a = json::array();
  for (const T& x : v) a.push_back(json_of(x));
  return a;
}

json step_json(const records::StepRecord& r) {
  json j;
  records::for_each_field(
      [&j](const records::StepField& f, const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::vector<records::ModuleDigest>>)
          if (value.empty()) return;  // a recorder run's only
        j[f.name] = json_of(value);
      },
      r);
  return j;
}

// An evaluation as JSON: tokens, batches and perplexity are 0 for a classifier and in traces
// from before they were recorded.
json eval_json(const records::EvalRecord& e) {
  return {{"step", e.step},         {"epoch", e.epoch},   {"samples", e.samples}, {"loss", e.loss},
          {"accuracy", e.accuracy}, {"tokens", e.tokens}, {"batches", e.batches}, {"perplexity", e.perplexity()}};
}

void print_json(const TraceReader& reader, uint64_t first, uint64_t last, std::ostream& out) {
  json j;
  j["header"] = header_json(reader.header());
  json steps = json::array();
  for (const records::StepRecord& r : reader.steps(first, last)) steps.push_back(step_json(r));
  j["steps"] = steps;
  json evals = json::array();
  for (const records::EvalRecord& e : reader.evals()) {
    evals.push_back(eval_json(e));
  }
  j["evals"] = evals;
  json events = json::array();
  for (const records::EventRecord& e : reader.events()) {
    events.push_back({{"step", e.step}, {"kind", e.kind}, {"message", e.message}});
  }
  j["events"] = events;
  if (auto w = reader.tail_warning()) j["tail_warning"] = *w;
  // Non-finite numbers become null; invalid UTF-8 in user text is replaced rather than thrown.
  out << j.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
}

void print_jsonl(const TraceReader& reader, uint64_t first, uint64_t last, std::ostream& out) {
  auto line = [&out](json j) { out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n'; };
  json h = header_json(reader.header());
  h["type"] = "header";
  line(h);
  const auto evals = reader.evals();
  const auto events = reader.events();
  size_t ev = 0, en = 0;
  auto rows_until = [&](uint64_t step) {  // evals and events of steps <= `step`, in step order
    while (ev < evals.size() || en < events.size()) {
      const bool take_eval = ev < evals.size() && (en >= events.size() || evals[ev].step < events[en].step);
      const uint64_t s = take_eval ? evals[ev].step : events[en].step;
      if (s > step) return;
      if (take_eval) {
        const auto& e = evals[ev++];
        if (e.step >= first && e.step <= last) {
          json j = eval_json(e);
          j["type"] = "eval";
          line(j);
        }
      } else {
        const auto& e = events[en++];
        if (e.step >= first && e.step <= last)
          line({{"type", "event"}, {"step", e.step}, {"kind", e.kind}, {"message", e.message}});
      }
    }
  };
  for (const records::StepRecord& r : reader.steps(first, last)) {
    rows_until(r.step == 0 ? 0 : r.step - 1);
    json j = step_json(r);
    j["type"] = "step";
    line(j);
  }
  rows_until(UINT64_MAX);
}

// Quotes a CSV field when it needs it (RFC 4180).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q.push_back('"');
    q.push_back(c);
  }
  q.push_back('"');
  return q;
}

// The CSV's columns: the fields in the trace's order, the timings as one column per phase, and
// the fields recorded only when set (records::InDigest::kWhenSet) after them, so that the columns of
// older versions keep their places; timings added later (checkpoint_ms) come last for the same reason.
template <typename Record, typename Emit>
void csv_fields(const Record& r, Emit&& emit) {
  for (bool when_set : {false, true})
    records::for_each_field(
        [&](const records::StepField& f, const auto& value) {
          if ((f.digest == records::InDigest::kWhenSet) != when_set) return;
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, records::Timings>) {
            emit("data_ms", number(value.data_ms));
            emit("forward_ms", number(value.forward_ms));
            emit("backward_ms", number(value.backward_ms));
            emit("optimizer_ms", number(value.optimizer_ms));
            emit("trace_ms", number(value.trace_ms));
            emit("allreduce_ms", number(value.allreduce_ms));
          } else {
            emit(f.name, csv_field(records::value_text(value)));
          }
        },
        r);
  emit("checkpoint_ms", number(r.timings.checkpoint_ms));
}

void print_csv(const TraceReader& reader, uint64_t first, uint64_t last, std::ostream& out) {
  const char* sep = "";
  csv_fields(records::StepRecord{}, [&](const char* name, const std::string&) {
    out << sep << name;
    sep = ",";
  });
  out << '\n';
  for (const records::StepRecord& r : reader.steps(first, last)) {
    sep = "";
    csv_fields(r, [&](const char*, const std::string& value) {
      out << sep << value;
      sep = ",";
    });
    out << '\n';
  }
}

// Pads or cuts to a column width so the table lines up.
std::string cell(const std::string& s, size_t width, bool right) {
  if (s.size() >= width) return s;
  std::string pad(width - s.size(), ' ');
  return right ? pad + s : s + pad;
}

void print_table(const TraceReader& reader, uint64_t first, uint64_t last, std::ostream& out) {
  const records::TraceHeader& h = reader.header();
  uint64_t numbers = 0;
  for (const records::ParamInfo& p : h.params) numbers += param_count(p);
  out << "trace        " << reader.path() << '\n'
      << "schema       " << h.schema << '\n'
      << "version      " << h.retrace_version << '\n'
      << "config hash  " << h.config_hash << '\n'
      << "seed         " << h.seed << '\n'
      << "world size   " << h.world_size << '\n'
      << "created      " << h.created_utc << '\n'
      << "model        " << h.model_description << '\n'
      << "params       " << h.params.size() << " tensors, " << numbers << " numbers\n"
      << "total steps  " << h.total_steps << '\n'
      << "eff. batch   " << h.effective_batch << " (micro batch x accum steps x world size)\n";
  out << "fingerprint\n";
  for (const records::KeyValue& kv : h.fingerprint) out << "  " << kv.key << '=' << kv.value << '\n';
  out << "data files\n";
  for (const records::FileInfo& f : h.data_files) {
    out << "  " << f.path << " (" << f.size << " bytes, sha256 " << f.sha256 << ")\n";
  }
  out << "faults\n";
  if (h.faults.empty()) out << "  none\n";
  for (const records::Fault& f : h.faults) {
    out << "  " << f.kind << " at step " << f.step << (f.arg.empty() ? "" : " (" + f.arg + ")") << '\n';
  }
  if (auto w = reader.tail_warning()) out << "warning: " << *w << '\n';

  struct Column {
    const char* name;
    size_t width;
    bool right;
  };
  const std::vector<Column> columns = {{"step", 7, true},
                                       {"epoch", 5, true},
                                       {"batch", 6, true},
                                       {"loss", 12, true},
                                       {"grad_pre", 11, true},
                                       {"grad_post", 11, true},
                                       {"lr", 11, true},
                                       {"scale", 8, true},
                                       {"outcome", 10, false},
                                       {"param", kDigestPrefix, false},
                                       {"chain", kDigestPrefix, false},
                                       {"step_ms", 9, true}};
  auto row = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) out << ' ';
      out << cell(cells[i], columns[i].width, columns[i].right);
    }
    out << '\n';
  };
  out << '\n';
  std::vector<std::string> names;
  for (const Column& c : columns) names.push_back(c.name);
  row(names);
  for (const records::StepRecord& r : reader.steps(first, last)) {
    row({std::to_string(r.step), std::to_string(r.epoch), std::to_string(r.batch_in_epoch), fixed("%.6f", r.loss),
         fixed("%.4g", r.grad_norm_pre), fixed("%.4g", r.grad_norm_post), fixed("%.4g", r.lr),
         fixed("%g", r.loss_scale), outcome_text(r), r.param_digest.hex().substr(0, kDigestPrefix),
         r.chain_digest.hex().substr(0, kDigestPrefix), fixed("%.2f", r.timings.step_ms())});
  }
  std::vector<records::EvalRecord> evals = reader.evals();
  out << "\nevals\n";
  if (evals.empty()) out << "  none\n";
  for (const records::EvalRecord& e : evals) {
    out << "  step " << e.step << " epoch " << e.epoch << ": loss " << fixed("%.6f", e.loss);
    if (e.language_model())
      out << ", perplexity " << fixed("%.4f", e.perplexity()) << " over " << e.tokens << " tokens (" << e.samples
          << " samples, " << e.batches << " batches)\n";
    else out << ", accuracy " << fixed("%.4f", e.accuracy) << " over " << e.samples << " samples\n";
  }
  std::vector<records::EventRecord> events = reader.events();
  out << "\nevents\n";
  if (events.empty()) out << "  none\n";
  for (const records::EventRecord& e : events) {
    out << "  step " << e.step << ' ' << e.kind << ": " << e.message << '\n';
  }
}

}  // namespace

void print_inspect(const TraceReader& reader, InspectFormat format, uint64_t first, uint64_t last, std::ostream& out) {
  switch (format) {
    case InspectFormat::kTable: print_table(reader, first, last, out); break;
    case InspectFormat::kJson: print_json(reader, first, last, out); break;
    case InspectFormat::kCsv: print_csv(reader, first, last, out); break;
    case InspectFormat::kJsonl: print_jsonl(reader, first, last, out); break;
  }
}

}  // namespace retrace::trace
