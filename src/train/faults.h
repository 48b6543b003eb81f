// Fault injection (`--inject KIND@STEP[:ARG],...`, config key faults.inject). Faults are part of
// the config, so they are recorded in config.toml and the trace header and replay reproduces them.
//   nan-loss@S            the loss of step S becomes NaN (skip: non_finite_loss)
//   inf-grad@S[:PARAM]    one gradient element of PARAM (default: a parameter chosen by a Philox
//                         draw keyed by (seed, S)) becomes +inf before unscale (skip: non_finite_grad)
//   spike@S[:FACTOR]      the loss of step S is multiplied by FACTOR (default 10)
//   crash@S               the process kills itself (SIGKILL) right after step S is traced, once per
//                         run directory: resume does not crash again
//   perturb-param@S:PARAM the lowest bit of element 0 of PARAM is flipped before step S
//   crash-in-eval@S       the process kills itself (SIGKILL) during the evaluation after step S,
//                         after its first batch, once per run directory (an evaluation must be due
//                         after step S: eval.every_steps, an epoch's end or the last step)
//   crash-in-save@S       the process kills itself (SIGKILL) during the background save of step S,
//                         once its shard is durable and before its manifest (the commit), once per run
//                         directory (checkpoint.async; a synchronous save at S: an event, no crash)
//   corrupt-staging@S:T   the lowest bit of element 0 of tensor T of the checkpoint ("model/fc1.weight",
//                         "optim/fc1.weight/exp_avg") is flipped in the staging copy of step S's
//                         background save: its check against the trace must refuse the commit (once
//                         per run directory)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::train {

// Parses a comma-separated list; ConfigError naming the bad item and the valid kinds.
std::vector<records::Fault> parse_faults(const std::string& spec);

// Whether a fault of this kind ("crash", "crash-in-eval") is a process event: whether it fired
// says which process runs, not what the run computes, so it stays out of the state digest and a
// replay runs through it.
inline bool is_process_fault(const std::string& kind) {
  return kind == "crash" || kind == "crash-in-eval" || kind == "crash-in-save" || kind == "corrupt-staging";
}
// The kind of a fired fault's id ("crash@17" -> "crash").
inline std::string fault_kind_of(const std::string& id) { return id.substr(0, id.find('@')); }

}  // namespace retrace::train
