// libFuzzer target: a whole trace file. TraceReader::open (file header, frame scan, tail rules,
// hash chain) and then every record it indexes. Any outcome but a retrace::Error, or records that
// contradict the index they came from, is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "trace/trace_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int fd = memfd_create("trace-fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    retrace::trace::TraceReader r = retrace::trace::TraceReader::open(path);
    if (r.valid_bytes() > size) std::abort();
    size_t steps = 0;
    for (const auto& s : r.steps()) steps += s.micro_losses.size() + 1;
    for (const auto& e : r.index())
      if (e.kind == retrace::trace::FrameKind::kStep && !r.step(e.step)) std::abort();
    r.evals();
    r.events();
    if (steps == 0 && r.header().schema.empty()) std::abort();  // a header always has its schema
  } catch (const retrace::Error&) {}
  return 0;
}
