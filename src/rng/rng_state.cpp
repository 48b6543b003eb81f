#include "rng/rng_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstring>

#include "core/error.h"
#include "core/torch_compat.h"

namespace retrace::rng {
namespace {

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_bytes(std::string& out, const std::string& b) {
  put_u64(out, b.size());
  out += b;
}

class Cursor8 {
 public:
  explicit Cursor8(const std::string& b) : b_(b) {}
  uint64_t u64() {
    RETRACE_CHECK(pos_ + 8 <= b_.size(), FormatError, "RNG state is cut at byte ", pos_, " of ", b_.size());
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return v;
  }
  std::string bytes() {
    uint64_t n = u64();
    RETRACE_CHECK(n <= b_.size() - pos_, FormatError, "RNG state field of ", n, " bytes runs past the end (",
                  b_.size() - pos_, " left)");
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  const std::string& b_;
  size_t pos_ = 0;
};

std::string tensor_bytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

at::Tensor bytes_tensor(const std::string& s) {
  at::Tensor t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

constexpr uint64_t kMagic = 0x3153474e52525452ull;  // "RTRRNGS1"
}  // namespace

std::string RngState::serialize() const {
  std::string out;
  put_u64(out, kMagic);
  put_u64(out, generators.empty() ? kRngFormatVersion : kRngFormatVersionGenerators);
  put_u64(out, seed);
  put_bytes(out, cpu_generator);
  put_u64(out, cuda.size());
  for (const auto& d : cuda) {
    put_u64(out, static_cast<uint64_t>(d.device_index));
    put_bytes(out, d.state);
  }
  put_u64(out, cursor.epoch);
  put_u64(out, cursor.batch_in_epoch);
  put_u64(out, streams.size());
  for (const auto& s : streams) {
    put_bytes(out, s.name);
    put_u64(out, s.key);
    put_u64(out, s.position);
  }
  if (!generators.empty()) {
    put_u64(out, generators.size());
    for (const auto& [name, state] : generators) {
      put_bytes(out, name);
      put_bytes(out, state);
    }
  }
  return out;
}

RngState RngState::deserialize(const std::string& bytes) {
  Cursor8 in(bytes);
  RETRACE_CHECK(in.u64() == kMagic, FormatError, "RNG state does not start with its magic number");
  uint64_t version = in.u64();
  RETRACE_CHECK(version == kRngFormatVersion || version == kRngFormatVersionGenerators, FormatError,
                "RNG state format version ", version, ", this binary reads versions ", kRngFormatVersion, " and ",
                kRngFormatVersionGenerators);
  RngState s;
  s.seed = in.u64();
  s.cpu_generator = in.bytes();
  uint64_t n = in.u64();
  RETRACE_CHECK(n <= 1024, FormatError, "RNG state lists ", n, " CUDA devices (limit 1024)");
  for (uint64_t i = 0; i < n; ++i) {
    DeviceGeneratorState d;
    d.device_index = static_cast<int32_t>(in.u64());
    d.state = in.bytes();
    s.cuda.push_back(std::move(d));
  }
  s.cursor.epoch = in.u64();
  s.cursor.batch_in_epoch = in.u64();
  n = in.u64();
  RETRACE_CHECK(n <= 4096, FormatError, "RNG state lists ", n, " streams (limit 4096)");
  for (uint64_t i = 0; i < n; ++i) {
    NamedStream st;
    st.name = in.bytes();
    st.key = in.u64();
    st.position = in.u64();
    s.streams.push_back(std::move(st));
  }
  if (version == kRngFormatVersionGenerators) {
    n = in.u64();
    RETRACE_CHECK(n >= 1 && n <= 64, FormatError, "RNG state (version 2) lists ", n, " other generators (1 to 64)");
    for (uint64_t i = 0; i < n; ++i) {
      std::string name = in.bytes();
      RETRACE_CHECK(!name.empty() && (s.generators.empty() || s.generators.back().first < name), FormatError,
                    "RNG state's other generators are not named in sorted order without repeats (\"", name, "\")");
      s.generators.emplace_back(std::move(name), in.bytes());
    }
  }
  RETRACE_CHECK(in.done(), FormatError, "RNG state has trailing bytes");
  return s;
}

namespace {
void seed_generator(const c10::Device& device, uint64_t seed) {
  at::Generator g = compat::default_generator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
}
}  // namespace

void seed_cpu_and_device(uint64_t seed, int cuda_device) {
  seed_generator(c10::Device(c10::kCPU), seed);
  if (cuda_device >= 0) seed_generator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)), seed);
}

RngState capture_torch(uint64_t seed, int cuda_device) {
  RngState s;
  s.seed = seed;
  {
    at::Generator g = compat::default_generator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(g.mutex());
    s.cpu_generator = tensor_bytes(g.get_state());
  }
  if (cuda_device >= 0) {
    at::Generator g = compat::default_generator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
    std::lock_guard<std::mutex> lock(g.mutex());
    s.cuda.push_back({cuda_device, tensor_bytes(g.get_state())});
  }
  return s;
}

void check_restorable(const RngState& s, int cuda_device, const std::string& where) {
  auto size_of = [](const c10::Device& device) {
    at::Generator g = compat::default_generator(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    return static_cast<size_t>(g.get_state().numel());
  };
  const size_t cpu = size_of(c10::Device(c10::kCPU));
  RETRACE_CHECK(s.cpu_generator.size() == cpu, FormatError, where, ": the RNG state's torch CPU generator state is ",
                s.cpu_generator.size(), " bytes; this LibTorch's is ", cpu, " bytes");
  if (cuda_device < 0) return;
  const size_t device = size_of(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
  for (const auto& d : s.cuda)
    RETRACE_CHECK(d.state.size() == device, FormatError, where, ": the RNG state's CUDA generator state of device ",
                  d.device_index, " is ", d.state.size(), " bytes; this LibTorch's is ", device, " bytes");
}

void restore_torch(const RngState& s, int cuda_device) {
  // Everything checked before anything is set: LibTorch's set_state refuses a state of another
  // size with its own error, a FormatError first.
  check_restorable(s, -1, "the RNG state to restore");
  const DeviceGeneratorState* mine = nullptr;
  if (cuda_device >= 0) {
    for (const auto& d : s.cuda)
      if (d.device_index == cuda_device) mine = &d;
    if (!mine && s.cuda.size() == 1) mine = &s.cuda[0];
    RETRACE_CHECK(mine != nullptr, ConfigError, "this CUDA run resumes on device ", cuda_device,
                  " but the RNG state holds ",
                  s.cuda.empty() ? std::string("no CUDA generator (it was recorded on the CPU)")
                                 : std::to_string(s.cuda.size()) + " CUDA generators and none for that device",
                  "; resume with the runtime.device the run was recorded with");
    check_restorable(s, cuda_device, "the RNG state to restore");
  }
  {
    at::Generator g = compat::default_generator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(bytes_tensor(s.cpu_generator));
  }
  if (!mine) return;
  at::Generator g = compat::default_generator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(bytes_tensor(mine->state));
}

}  // namespace retrace::rng
