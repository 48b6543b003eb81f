// Ranks and their collectives, on c10d: ranks rendezvous through
// c10d's TCPStore from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, so launchers
// that set those (torchrun-style, Slurm, Kubernetes) work across hosts; collectives are Gloo's on
// CPU (NCCL on CUDA where LibTorch has it). We write no transport of our own.
//
// Determinism: Gloo's ring all-reduce adds the ranks' contributions in an order fixed by the world
// size and the bucket layout, so for a fixed world size the reduced gradients are the same bits
// on every run. Across world sizes the order (and so the rounding) differs: equal within float
// rounding, not bitwise (docs/distributed.md).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/endpoint.h"
#include "train/collective.h"

namespace retrace::distributed {

struct DistEnv {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t local_rank = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
};

// Reads the rendezvous variables; nullopt when WORLD_SIZE is unset. ConfigError naming the
// variable when one is malformed or RANK >= WORLD_SIZE.
std::optional<DistEnv> env_from_environment();

using CollectiveStats = train::CollectiveStats;

// The c10d implementation of train::Collective (the one a launched run uses).
class ProcessGroup final : public train::Collective {
 public:
  // Connects to the other ranks (blocks until all have joined or `timeout` passes: IoError).
  // cuda: NCCL on device LOCAL_RANK (only in builds with RETRACE_WITH_NCCL, else ConfigError);
  // otherwise Gloo.
  ProcessGroup(const DistEnv& env, std::chrono::milliseconds timeout, bool cuda = false);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  uint32_t rank() const override { return env_.rank; }
  uint32_t world_size() const override { return env_.world_size; }
  // Where this rank's transport is bound and how it was chosen (distributed/endpoint.h); how the rank was
  // launched; the other ranks' endpoints ("rank 1 at eth0 10.0.0.2 (...)"). For the fingerprint's
  // information fields and for the messages of failed collectives.
  const Endpoint& endpoint() const { return endpoint_; }
  const Launcher& launcher() const { return launcher_; }
  const std::string& peers() const { return peers_; }
  // "gloo", or "nccl 2.28.9" on CUDA.
  std::string backend() const;
  // A second group of the same ranks on the same store, its keys under `prefix`: Gloo on the CPU,
  // whatever this one's backend. For collectives issued from another thread than this group's
  // (a background save's commit vote): c10d matches a group's collectives by their order of issue,
  // which two threads would interleave differently on each rank. Every rank calls it at the same
  // point (it connects to the others, as the constructor does).
  std::unique_ptr<ProcessGroup> side_group(const std::string& prefix) const;

  // Sums every defined gradient over the ranks, in place, flattening them into buckets of at most
  // bucket_bytes in parameter order. Adds to stats.
  void allreduce_grads(const std::vector<torch::Tensor>& params, uint64_t bucket_bytes,
                       CollectiveStats& stats) override;
  // Sum of a scalar over the ranks (float32, like the losses it carries).
  float allreduce_sum(float value, CollectiveStats& stats) override;
  // All-to-all of float32 vectors: to_rank[r] goes to rank r; returns what each rank q sent this
  // one, recv_numel[q] elements from rank q, on the CPU (one c10d alltoall_base). Adds to stats.
  std::vector<torch::Tensor> alltoall(const std::vector<torch::Tensor>& to_rank, const std::vector<int64_t>& recv_numel,
                                      CollectiveStats& stats) override;
  // All-to-all of equal rows: row r of `rows` ([world, n], any dtype) goes to rank r; row q of the
  // result came from rank q. On this rank's collective device, where the rows already are on a GPU
  // (ZeRO's reduce-scatter of the gradients; one c10d alltoall_base). Adds to stats.
  torch::Tensor alltoall_rows(const torch::Tensor& rows, CollectiveStats& stats) override;
  // Every rank's `mine` (a 1-D tensor of the same numel and dtype on every rank), indexed by rank,
  // on this rank's collective device (ZeRO's all-gather of the parameters). Adds to stats.
  std::vector<torch::Tensor> allgather_tensor(const torch::Tensor& mine, CollectiveStats& stats) override;
  // Every rank's bytes, indexed by rank.
  std::vector<std::string> allgather(const std::string& mine) override;
  void barrier() override;

 private:
  ProcessGroup(const ProcessGroup& parent, const std::string& prefix);
  void connect_gloo();
  template <typename Fn>
  auto collective(const char* what, Fn&& fn) -> decltype(fn());

  DistEnv env_;
  std::chrono::milliseconds timeout_;
  Launcher launcher_;
  Endpoint endpoint_;
  std::string peers_;
  torch::Device device_ = torch::kCPU;  // where collective buffers live
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retrace::distributed
