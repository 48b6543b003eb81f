// Helpers shared by the trace tests and properties: sample records, field-by-field equality,
// temporary files.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "records/records.h"
#include "testing/step_records.h"
#include "testing/temp_dir.h"

namespace retrace::trace::testing {

using TempDir = ::retrace::testing::TempDir;  // the one test library's (tests/testing/temp_dir.h)

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

inline records::TraceHeader sample_header() {
  records::TraceHeader h;
  h.retrace_version = "0.1.0";
  h.config_toml = "[run]\nseed = 7\nsteps = 40\n";
  h.config_hash = "ab12cd34";
  h.seed = 7;
  h.fingerprint = {{"libtorch", "2.3.0"}, {"blas", "openblas"}, {"threads", "1"}};
  h.model_description = "mlp 784-128-10";
  h.params = {{"fc1.weight", {128, 784}, "float32"},
              {"fc1.bias", {128}, "float32"},
              {"fc2.weight", {10, 128}, "float32"}};
  h.data_files = {{"data/train-images-idx3-ubyte", 47040016, "00ff"}};
  h.faults = {{"nan-loss", 5, ""}, {"spike", 9, "100"}};
  h.total_steps = 40;
  h.world_size = 2;
  h.created_utc = "2024-01-02T03:04:05Z";
  return h;
}

// A typical record: two micro-batches on two ranks.
inline records::StepRecord sample_step(uint64_t n) {
  records::StepRecord r;
  r.step = n;
  r.epoch = n / 10;
  r.batch_in_epoch = n % 10;
  r.batch_size = 64;
  r.sample_digest = {n * 31 + 1, n * 17 + 2};
  r.loss = 2.3 / static_cast<double>(n + 1);
  float f = static_cast<float>(r.loss);
  std::memcpy(&r.loss_bits, &f, 4);
  r.grad_norm_pre = 1.5 + n;
  r.grad_norm_post = 1.0;
  r.lr = 1e-3;
  r.loss_scale = 65536;
  if (n % 7 == 5) {
    r.outcome = records::Outcome::kSkip;
    r.skip_reason = "non_finite_loss";
  }
  r.param_digest = {0x1111 * n, 0x2222 + n};
  r.optim_digest = {0x3333 * n, 0x4444 + n};
  r.rng_digest = {0x5555 * n, 0x6666 + n};
  r.micro_batch_sizes = {32, 32};
  r.micro_losses = {r.loss * 0.9, r.loss * 1.1};
  r.rank_grad_digests = {{n, 1}, {n, 2}};
  if (n % 3 == 1) r.grad_digest = {0x7777 * n, 0x8888 + n};  // trace.digest_version 3's; absent in others
  r.timings = {1.0, 2.0, 3.0, 0.5, 0.01 * n};
  return r;
}

inline bool steps_equal(const records::StepRecord& a, const records::StepRecord& b) {
  return retrace::testing::differing_fields(a, b).empty();
}

inline bool headers_equal(const records::TraceHeader& a, const records::TraceHeader& b) {
  auto kv_eq = [](const records::KeyValue& x, const records::KeyValue& y) {
    return x.key == y.key && x.value == y.value;
  };
  auto p_eq = [](const records::ParamInfo& x, const records::ParamInfo& y) {
    return x.name == y.name && x.shape == y.shape && x.dtype == y.dtype;
  };
  auto f_eq = [](const records::FileInfo& x, const records::FileInfo& y) {
    return x.path == y.path && x.size == y.size && x.sha256 == y.sha256;
  };
  auto fault_eq = [](const records::Fault& x, const records::Fault& y) {
    return x.kind == y.kind && x.step == y.step && x.arg == y.arg;
  };
  return a.schema == b.schema && a.retrace_version == b.retrace_version && a.config_toml == b.config_toml &&
         a.config_hash == b.config_hash && a.seed == b.seed && a.fingerprint.size() == b.fingerprint.size() &&
         std::equal(a.fingerprint.begin(), a.fingerprint.end(), b.fingerprint.begin(), kv_eq) &&
         a.model_description == b.model_description && a.params.size() == b.params.size() &&
         std::equal(a.params.begin(), a.params.end(), b.params.begin(), p_eq) &&
         a.data_files.size() == b.data_files.size() &&
         std::equal(a.data_files.begin(), a.data_files.end(), b.data_files.begin(), f_eq) &&
         a.faults.size() == b.faults.size() &&
         std::equal(a.faults.begin(), a.faults.end(), b.faults.begin(), fault_eq) && a.total_steps == b.total_steps &&
         a.world_size == b.world_size && a.created_utc == b.created_utc;
}

}  // namespace retrace::trace::testing
