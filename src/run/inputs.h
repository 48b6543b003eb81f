// The inputs a trace header records with their sha256 (data files, TorchScript model files),
// checked again before a run is resumed or replayed: a run continued or re-executed on other
// inputs is not the recorded run.
#pragma once

#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::run {

struct InputChange {
  std::string path;
  std::string recorded;  // sha256 in the header
  std::string now;       // sha256 of the file now; empty when it is missing or unreadable
};

// The recorded files whose content is not what the header says, in header order.
std::vector<InputChange> changed_inputs(const std::vector<records::FileInfo>& recorded);
// "data file F changed since the run was recorded (sha256 A... in the trace header, B... now); ..."
std::string describe_changes(const std::vector<InputChange>& changes);

}  // namespace retrace::run
