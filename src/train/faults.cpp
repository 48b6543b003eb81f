#include "train/faults.h"

#include <sstream>

#include "core/error.h"
#include "core/parse_number.h"
#include "core/text_list.h"

namespace retrace::train {

std::vector<records::Fault> parse_faults(const std::string& spec) {
  std::vector<records::Fault> out;
  const char* kinds = "nan-loss, inf-grad, spike, crash, crash-in-eval, perturb-param, crash-in-save, corrupt-staging";
  for (const std::string& item : split_list(spec)) {
    auto at = item.find('@');
    RETRACE_CHECK(at != std::string::npos && at > 0, ConfigError, "bad fault \"", item,
                  "\": expected KIND@STEP[:ARG] with KIND one of ", kinds);
    records::Fault f;
    f.kind = item.substr(0, at);
    std::string rest = item.substr(at + 1);
    auto colon = rest.find(':');
    std::string step = rest.substr(0, colon);
    if (colon != std::string::npos) f.arg = rest.substr(colon + 1);
    RETRACE_CHECK(f.kind == "nan-loss" || f.kind == "inf-grad" || f.kind == "spike" || f.kind == "crash" ||
                      f.kind == "crash-in-eval" || f.kind == "perturb-param" || f.kind == "crash-in-save" ||
                      f.kind == "corrupt-staging",
                  ConfigError, "bad fault \"", item, "\": unknown kind \"", f.kind, "\"; valid kinds: ", kinds);
    const std::optional<uint64_t> at_step = parse_decimal_u64(step);
    RETRACE_CHECK(at_step && *at_step > 0, ConfigError, "bad fault \"", item,
                  "\": the step must be a number >= 1, got \"", step, "\"");
    f.step = *at_step;
    if (f.kind == "perturb-param")
      RETRACE_CHECK(!f.arg.empty(), ConfigError, "bad fault \"", item,
                    "\": perturb-param needs a parameter name, e.g. perturb-param@57:layers.0.weight");
    if (f.kind == "corrupt-staging")
      RETRACE_CHECK(!f.arg.empty(), ConfigError, "bad fault \"", item,
                    "\": corrupt-staging needs a tensor of the checkpoint, e.g. corrupt-staging@20:model/fc1.weight");
    if (f.kind == "crash-in-save")
      RETRACE_CHECK(f.arg.empty(), ConfigError, "bad fault \"", item,
                    "\": crash-in-save takes no argument (it kills the process during step S's background save, "
                    "after its shard is durable and before its manifest)");
    if (f.kind == "spike" && !f.arg.empty()) {
      const std::optional<double> factor = parse_finite_double(f.arg);
      RETRACE_CHECK(factor && *factor > 0, ConfigError, "bad fault \"", item,
                    "\": the spike factor must be a finite positive number, got \"", f.arg, "\"");
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace retrace::train
