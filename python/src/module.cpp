// retrace._core: the Python package's compiled part, over retrace's public C++ API only
// (include/retrace/retrace.h, Recorder and LoopState). Tensors cross as PyTorch's own (torch's
// pybind11 caster): no copy, and the digests are computed by the same C++ code as a C++ loop's.
// The C++ errors become the Python classes of retrace.errors, with the CLI's exit code.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/headeronly/version.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retrace/retrace.h"

namespace py = pybind11;

namespace {

using Blobs = std::vector<std::pair<std::string, py::bytes>>;

// The class of retrace.errors for a C++ error, by its most derived type.
const char* class_name(const retrace::Error& e) {
  if (dynamic_cast<const retrace::ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const retrace::FormatError*>(&e)) return "FormatError";
  if (dynamic_cast<const retrace::IntegrityError*>(&e)) return "IntegrityError";
  if (dynamic_cast<const retrace::IoError*>(&e)) return "IoError";
  if (dynamic_cast<const retrace::InvariantError*>(&e)) return "InvariantError";
  return "Error";
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "retrace's recorder (C++), for the retrace package; use retrace.Recorder";
  m.attr("torch_version") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                            std::to_string(TORCH_VERSION_PATCH);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const retrace::Error& e) {
      py::object cls = py::module_::import("retrace.errors").attr(class_name(e));
      py::object exc = cls(std::string(e.what()), static_cast<int>(e.exit_code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  m.def("data_order", &retrace::data_order, py::arg("seed"), py::arg("num_samples"), py::arg("epoch"),
        py::arg("order") = "feistel", "retrace record's sample order of an epoch (retrace.h, data_order)");

  py::class_<retrace::LoopState>(m, "LoopState")
      .def(py::init<>())
      .def_readwrite("parameters", &retrace::LoopState::parameters)
      .def_readwrite("buffers", &retrace::LoopState::buffers)
      .def_readwrite("optimizer", &retrace::LoopState::optimizer)
      .def_readwrite("optimizer_kind", &retrace::LoopState::optimizer_kind)
      .def_readwrite("cuda_device", &retrace::LoopState::cuda_device)
      .def_property(
          "generators",
          [](const retrace::LoopState& s) {
            Blobs out;
            for (const auto& [name, state] : s.generators) out.emplace_back(name, py::bytes(state));
            return out;
          },
          [](retrace::LoopState& s, const std::vector<std::pair<std::string, std::string>>& g) { s.generators = g; })
      .def_readwrite("epoch", &retrace::LoopState::epoch)
      .def_readwrite("batch_in_epoch", &retrace::LoopState::batch_in_epoch)
      .def_readwrite("samples_seen", &retrace::LoopState::samples_seen)
      .def_readwrite("user", &retrace::LoopState::user);

  // The C++ structs as they are: the package fills them field by field (recorder.py).
  py::class_<retrace::RecorderOptions>(m, "RecorderOptions")
      .def(py::init<>())
      .def_readwrite("seed", &retrace::RecorderOptions::seed)
      .def_readwrite("config_toml", &retrace::RecorderOptions::config_toml)
      .def_readwrite("description", &retrace::RecorderOptions::description)
      .def_readwrite("data_files", &retrace::RecorderOptions::data_files)
      .def_readwrite("force", &retrace::RecorderOptions::force)
      .def_readwrite("keep_last", &retrace::RecorderOptions::keep_last)
      .def_readwrite("digest_version", &retrace::RecorderOptions::digest_version)
      .def_readwrite("module_digests", &retrace::RecorderOptions::module_digests)
      .def_readwrite("optimizer_digest_every", &retrace::RecorderOptions::optimizer_digest_every)
      .def_readwrite("overlap_digests", &retrace::RecorderOptions::overlap_digests);

  py::class_<retrace::StepInfo>(m, "StepInfo")
      .def(py::init<>())
      .def_readwrite("lr", &retrace::StepInfo::lr)
      .def_readwrite("grad_norm", &retrace::StepInfo::grad_norm)
      .def_readwrite("grad_norm_clipped", &retrace::StepInfo::grad_norm_clipped)
      .def_readwrite("skipped", &retrace::StepInfo::skipped)
      .def_readwrite("skip_reason", &retrace::StepInfo::skip_reason)
      .def_readwrite("batch_size", &retrace::StepInfo::batch_size)
      .def_readwrite("sample_indices", &retrace::StepInfo::sample_indices)
      .def_readwrite("batch", &retrace::StepInfo::batch)
      .def_readwrite("epoch", &retrace::StepInfo::epoch)
      .def_readwrite("batch_in_epoch", &retrace::StepInfo::batch_in_epoch);

  py::class_<retrace::Recorder>(m, "Recorder")
      .def_static(
          "create",
          [](const std::string& dir, const retrace::LoopState& state, const retrace::RecorderOptions& options) {
            py::gil_scoped_release release;
            return retrace::Recorder::create(dir, state, options);
          },
          py::arg("dir"), py::arg("state"), py::arg("options"))
      .def(
          "step",
          [](retrace::Recorder& r, uint64_t step, double loss, const retrace::LoopState& state,
             const retrace::StepInfo& info) {
            py::gil_scoped_release release;
            r.step(step, loss, state, info);
          },
          py::arg("step"), py::arg("loss"), py::arg("state"), py::arg("info"))
      .def(
          "checkpoint",
          [](retrace::Recorder& r, uint64_t step, const retrace::LoopState& state) {
            py::gil_scoped_release release;
            return r.checkpoint(step, state);
          },
          py::arg("step"), py::arg("state"))
      .def_static(
          "resume",
          [](const std::string& dir, const retrace::LoopState& current) {
            retrace::LoopState restored;
            std::optional<retrace::Recorder> rec;
            {
              py::gil_scoped_release release;
              rec.emplace(retrace::Recorder::resume(dir, current, restored));
            }
            return std::make_pair(std::move(*rec), std::move(restored));
          },
          py::arg("dir"), py::arg("current"))
      .def("evaluate", &retrace::Recorder::evaluate, py::arg("step"), py::arg("loss"), py::arg("accuracy"),
           py::arg("samples"), py::arg("tokens"), py::arg("batches"), py::call_guard<py::gil_scoped_release>())
      .def("event", &retrace::Recorder::event, py::arg("step"), py::arg("kind"), py::arg("message"),
           py::call_guard<py::gil_scoped_release>())
      .def("sync", &retrace::Recorder::sync, py::call_guard<py::gil_scoped_release>())
      .def("close", &retrace::Recorder::close, py::call_guard<py::gil_scoped_release>())
      .def("wait", &retrace::Recorder::wait, py::call_guard<py::gil_scoped_release>())
      .def("overlap_digests", &retrace::Recorder::overlap_digests, py::arg("on"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("last_step", &retrace::Recorder::last_step)
      .def_property_readonly("dir", &retrace::Recorder::dir);
}
