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
  std::string recorded;  // sha256 in the header; empty for a file the header does not list (added)
  std::string now;       // sha256 of the file now; empty when it is missing or unreadable
};

// The recorded files whose content is not what the header says, in header order, then the files
// of `loaded` that the header does not list (a shard added since). `loaded` holds files already
// read and hashed (the data set as just loaded): their sha256 is taken from it, so a data set is
// read once, not once more for this check; the other recorded files (a model file) are hashed here.
std::vector<InputChange> changed_inputs(const std::vector<records::FileInfo>& recorded,
                                        const std::vector<records::FileInfo>& loaded = {});
// "data file F changed since the run was recorded (sha256 A... in the trace header, B... now); ..."
std::string describe_changes(const std::vector<InputChange>& changes);

}  // namespace retrace::run
