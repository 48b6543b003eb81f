#include "distributed/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(RETRACE_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/torch_compat.h"

namespace retrace::distributed {
namespace {
uint64_t env_u64(const char* name, uint64_t fallback, bool required) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    RETRACE_CHECK(!required, ConfigError, "environment variable ", name,
                  " is not set; data-parallel ranks need RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                  "(or start them with `retrace record --world-size N`)");
    return fallback;
  }
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  RETRACE_CHECK(end && *end == '\0', ConfigError, "environment variable ", name, "=\"", v, "\" is not a number");
  return x;
}
// c10d's errors carry a C++ stack trace in what(); the message alone is what a user needs.
std::string message_of(const std::exception& e) {
  std::string m;
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) m = c->what_without_backtrace();
  else m = e.what();
  for (const char* cut : {"\nException raised from", "\nframe #"})
    if (auto pos = m.find(cut); pos != std::string::npos) m.erase(pos);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}
}  // namespace

// Collectives fail when another rank died, the link to it went down or the timeout passed: an
// environment problem with a message that says which rank saw it and who its peers are, not an
// internal error.
template <typename Fn>
auto ProcessGroup::collective(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const retrace::Error&) {
    throw;
  } catch (const std::exception& e) {
    RETRACE_FAIL(IoError, "rank ", env_.rank, " (", endpoint_.describe(), "): ", what, " failed: ", message_of(e),
                 "; peers: ", peers_,
                 ". Another rank probably stopped, the network to it is down, or the "
                 "collective timeout (runtime.collective_timeout_s = ",
                 timeout_.count() / 1000.0, ") passed");
  }
}

std::optional<DistEnv> env_from_environment() {
  if (!std::getenv("WORLD_SIZE")) return std::nullopt;
  DistEnv e;
  e.world_size = static_cast<uint32_t>(env_u64("WORLD_SIZE", 1, true));
  e.rank = static_cast<uint32_t>(env_u64("RANK", 0, true));
  e.local_rank = static_cast<uint32_t>(env_u64("LOCAL_RANK", e.rank, false));
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = static_cast<uint16_t>(env_u64("MASTER_PORT", 29500, false));
  RETRACE_CHECK(e.world_size >= 1 && e.rank < e.world_size, ConfigError, "RANK=", e.rank,
                " is not below WORLD_SIZE=", e.world_size);
  return e;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::C10dBackend> pg;
};

ProcessGroup::ProcessGroup(const DistEnv& env, std::chrono::milliseconds timeout, bool cuda)
    : env_(env), timeout_(timeout), launcher_(launcher_from_environment()), impl_(new Impl) {
#if !defined(RETRACE_WITH_NCCL)
  RETRACE_CHECK(!cuda, ConfigError,
                "data parallelism on CUDA needs NCCL, and this retrace was built without it "
                "(configure with -DRETRACE_WITH_NCCL=ON against a LibTorch with CUDA); on CPU ranks use Gloo");
#endif
  if (cuda) device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  // Before anything connects: a bad GLOO_SOCKET_IFNAME or MASTER_ADDR is the user's to fix.
  endpoint_ = choose_endpoint(env.master_addr, env.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = env.master_port;
    // Under torchrun the agent already serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE)
    // and every rank is its client; each restart's keys live under their own prefix, as PyTorch's.
    so.isServer = env.rank == 0 && !launcher_.agent_store;
    if (!launcher_.agent_store) so.numWorkers = env.world_size;
    so.waitWorkers = !launcher_.agent_store;
    so.timeout = timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    if (launcher_.agent_store)
      impl_->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" +
                                                                std::to_string(launcher_.restart_count),
                                                            impl_->store);
    // Every rank's endpoint, so that a failed collective can name its peers.
    const std::string mine = endpoint_.describe();
    impl_->store->set("retrace/endpoint/" + std::to_string(env.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (uint32_t r = 0; r < env.world_size; ++r) {
      if (r == env.rank) continue;
      const std::vector<uint8_t> v = impl_->store->get("retrace/endpoint/" + std::to_string(r));
      peers_ += (peers_.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " at " + std::string(v.begin(), v.end()));
    }
#if defined(RETRACE_WITH_NCCL)
    if (cuda) {
      auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
      nccl_opts->timeout = timeout;
      impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, static_cast<int>(env.rank),
                                                              static_cast<int>(env.world_size), nccl_opts);
      return;
    }
#endif
    connect_gloo();
  } catch (const retrace::Error&) {
    throw;
  } catch (const std::exception& e) {
    RETRACE_FAIL(IoError, "rank ", env.rank, " of ", env.world_size, " (", endpoint_.describe(),
                 ") could not join the process group at ", env.master_addr, ":", env.master_port,
                 " (launcher: ", launcher_.describe(), "): ", message_of(e),
                 launcher_.agent_store
                     ? "; under torchrun the agent serves the store (TORCHELASTIC_USE_AGENT_STORE), and only a "
                       "torchrun of the same torch version as this retrace's LibTorch " +
                           compat::libtorch_version() + " speaks its protocol"
                     : "; check that every rank started and that the address and port are reachable");
  }
}

void ProcessGroup::connect_gloo() {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
  if (endpoint_.chosen_by == "GLOO_SOCKET_IFNAME") {
    for (const auto& name : endpoint_.interfaces)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(endpoint_.address));
  }
  opts->threads = 1;
  impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, static_cast<int>(env_.rank),
                                                          static_cast<int>(env_.world_size), opts);
}

ProcessGroup::ProcessGroup(const ProcessGroup& parent, const std::string& prefix)
    : env_(parent.env_),
      timeout_(parent.timeout_),
      launcher_(parent.launcher_),
      endpoint_(parent.endpoint_),
      peers_(parent.peers_),
      impl_(new Impl) {
  try {
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(prefix, parent.impl_->store);
    connect_gloo();
  } catch (const retrace::Error&) {
    throw;
  } catch (const std::exception& e) {
    RETRACE_FAIL(IoError, "rank ", env_.rank, " of ", env_.world_size, " (", endpoint_.describe(),
                 ") could not make its second process group (", prefix, "): ", message_of(e), "; peers: ", peers_);
  }
}

std::unique_ptr<ProcessGroup> ProcessGroup::side_group(const std::string& prefix) const {
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(*this, prefix));
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend() const {
#if defined(RETRACE_WITH_NCCL)
  if (device_.is_cuda()) return "nccl " + c10d::getNcclVersion();
#endif
  return "gloo";
}

void ProcessGroup::allreduce_grads(const std::vector<torch::Tensor>& params, uint64_t bucket_bytes,
                                   CollectiveStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  size_t i = 0;
  while (i < grads.size()) {
    std::vector<torch::Tensor> bucket;
    uint64_t bytes = 0;
    while (i < grads.size() && (bucket.empty() || bytes + grads[i].nbytes() <= bucket_bytes)) {
      bytes += grads[i].nbytes();
      bucket.push_back(grads[i++]);
    }
    std::vector<torch::Tensor> flat_parts;
    for (const auto& g : bucket) flat_parts.push_back(g.reshape({-1}));
    std::vector<torch::Tensor> flat = {torch::cat(flat_parts)};
    collective("gradient all-reduce", [&] { return impl_->pg->allreduce(flat, c10d::AllreduceOptions{})->wait(); });
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (auto& g : bucket) {
      g.copy_(flat[0].slice(0, offset, offset + g.numel()).view_as(g));
      offset += g.numel();
    }
    stats.calls += 1;
    stats.bytes += bytes;
  }
  stats.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

float ProcessGroup::allreduce_sum(float value, CollectiveStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> t = {torch::full({1}, value, torch::TensorOptions(torch::kFloat32).device(device_))};
  collective("loss all-reduce", [&] { return impl_->pg->allreduce(t, c10d::AllreduceOptions{})->wait(); });
  stats.calls += 1;
  stats.bytes += 4;
  stats.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return t[0].item<float>();
}

std::vector<torch::Tensor> ProcessGroup::allgather_tensor(const torch::Tensor& mine, CollectiveStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> in = {mine.contiguous().to(device_)};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (uint32_t r = 0; r < env_.world_size; ++r) out[0].push_back(torch::empty_like(in[0]));
  collective("parameter all-gather", [&] { return impl_->pg->allgather(out, in)->wait(); });
  stats.calls += 1;
  stats.bytes += static_cast<uint64_t>(in[0].nbytes());
  stats.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out[0];
}

std::vector<std::string> ProcessGroup::allgather(const std::string& mine) {
  // Sizes first, then the bytes padded to the largest.
  const auto i64 = torch::TensorOptions(torch::kInt64).device(device_);
  const auto u8 = torch::TensorOptions(torch::kUInt8).device(device_);
  std::vector<torch::Tensor> in = {torch::full({1}, static_cast<int64_t>(mine.size()), i64)};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (uint32_t r = 0; r < env_.world_size; ++r) out[0].push_back(torch::empty({1}, i64));
  collective("all-gather", [&] { return impl_->pg->allgather(out, in)->wait(); });
  int64_t max_size = 1;
  std::vector<int64_t> sizes;
  for (const auto& t : out[0]) {
    sizes.push_back(t.item<int64_t>());
    max_size = std::max(max_size, sizes.back());
  }
  torch::Tensor mine_t = torch::zeros({max_size}, torch::kUInt8);
  std::memcpy(mine_t.data_ptr(), mine.data(), mine.size());
  std::vector<torch::Tensor> in2 = {mine_t.to(device_)};
  std::vector<std::vector<torch::Tensor>> out2(1);
  for (uint32_t r = 0; r < env_.world_size; ++r) out2[0].push_back(torch::empty({max_size}, u8));
  collective("all-gather", [&] { return impl_->pg->allgather(out2, in2)->wait(); });
  std::vector<std::string> result;
  for (uint32_t r = 0; r < env_.world_size; ++r) {
    torch::Tensor host = out2[0][r].to(torch::kCPU);
    result.emplace_back(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(sizes[r]));
  }
  return result;
}

std::vector<torch::Tensor> ProcessGroup::alltoall(const std::vector<torch::Tensor>& to_rank,
                                                  const std::vector<int64_t>& recv_numel, CollectiveStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> send_sizes, recv_sizes(recv_numel.begin(), recv_numel.end());
  for (const auto& t : to_rank) {
    flat.push_back(t.reshape({-1}).to(torch::kFloat32));
    send_sizes.push_back(flat.back().numel());
  }
  torch::Tensor in = torch::cat(flat).to(device_);
  int64_t total = 0;
  for (int64_t n : recv_sizes) total += n;
  torch::Tensor out = torch::empty({total}, torch::TensorOptions(torch::kFloat32).device(device_));
  // c10d may move the split-size vectors into its work object: it gets copies.
  std::vector<int64_t> out_splits = recv_sizes, in_splits = send_sizes;
  collective("all-to-all",
             [&] { return impl_->pg->alltoall_base(out, in, out_splits, in_splits, c10d::AllToAllOptions{})->wait(); });
  out = out.to(torch::kCPU);
  std::vector<torch::Tensor> result;
  int64_t offset = 0;
  for (int64_t n : recv_sizes) {
    result.push_back(out.slice(0, offset, offset + n));
    offset += n;
  }
  stats.calls += 1;
  stats.bytes += static_cast<uint64_t>(in.nbytes());
  stats.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

torch::Tensor ProcessGroup::alltoall_rows(const torch::Tensor& rows, CollectiveStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor in = rows.contiguous().to(device_);
  torch::Tensor out = torch::empty_like(in);
  std::vector<int64_t> out_splits, in_splits;  // empty: the first dimension split evenly among the ranks
  collective("gradient reduce-scatter",
             [&] { return impl_->pg->alltoall_base(out, in, out_splits, in_splits, c10d::AllToAllOptions{})->wait(); });
  stats.calls += 1;
  stats.bytes += static_cast<uint64_t>(in.nbytes());
  stats.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void ProcessGroup::barrier() {
  collective("barrier", [&] { return impl_->pg->barrier()->wait(); });
}

}  // namespace retrace::distributed
