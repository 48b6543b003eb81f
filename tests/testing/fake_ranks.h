// Ranks as threads of one process, for tests: a train::Collective over shared memory. W threads
// each hold one FakeRank of one FakeWorld; a collective returns once every rank has called it.
// The ranks take turns computing (FakeWorld::turn, held while a rank computes and given up while
// it waits at a collective), because torch's CPU generator is one per process.
//
// The sums are in rank order (what Gloo's ring does, up to order): equal bits for a fixed world
// size, like the real thing; tests/distributed/distributed_test.cpp runs real Gloo ranks.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "train/collective.h"

namespace retrace::testing {

class FakeWorld {
 public:
  explicit FakeWorld(int world)
      : world_(world), tensors_(static_cast<size_t>(world * world)), texts_(static_cast<size_t>(world)) {}
  int size() const { return world_; }
  std::mutex turn;

  // to[r] goes to rank r; returns what every rank q sent this one, in rank order.
  std::vector<torch::Tensor> exchange(int rank, const std::vector<torch::Tensor>& to) {
    std::vector<torch::Tensor> out;
    meet(
        [&] {
          for (int r = 0; r < world_; ++r)
            tensors_[static_cast<size_t>(rank * world_ + r)] = to[static_cast<size_t>(r)].reshape({-1}).clone();
        },
        [&](const std::vector<torch::Tensor>& all, const std::vector<std::string>&) {
          for (int q = 0; q < world_; ++q) out.push_back(all[static_cast<size_t>(q * world_ + rank)]);
        });
    return out;
  }
  std::vector<std::string> allgather(int rank, const std::string& mine) {
    std::vector<std::string> out;
    meet([&] { texts_[static_cast<size_t>(rank)] = mine; },
         [&](const std::vector<torch::Tensor>&, const std::vector<std::string>& all) { out = all; });
    return out;
  }

 private:
  // Every rank writes its part, the last to arrive publishes them all, then each reads its share.
  template <typename Write, typename Read>
  void meet(Write write, Read read) {
    std::unique_lock<std::mutex> lock(m_);
    write();
    turn.unlock();
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      published_tensors_ = tensors_;
      published_texts_ = texts_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    read(published_tensors_, published_texts_);
    lock.unlock();
    turn.lock();
  }

  int world_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<torch::Tensor> tensors_, published_tensors_;
  std::vector<std::string> texts_, published_texts_;
};

class FakeRank final : public train::Collective {
 public:
  FakeRank(FakeWorld& world, int rank) : world_(world), rank_(rank) {}
  uint32_t rank() const override { return static_cast<uint32_t>(rank_); }
  uint32_t world_size() const override { return static_cast<uint32_t>(world_.size()); }

  void allreduce_grads(const std::vector<torch::Tensor>& params, uint64_t, train::CollectiveStats& stats) override {
    torch::NoGradGuard no_grad;
    for (const auto& p : params) {
      if (!p.grad().defined()) continue;
      const auto all = allgather_tensor(p.grad(), stats);
      torch::Tensor sum = all[0].clone();
      for (size_t i = 1; i < all.size(); ++i) sum.add_(all[i]);
      p.grad().copy_(sum.view_as(p.grad()));
    }
  }
  float allreduce_sum(float value, train::CollectiveStats& stats) override {
    const auto all = allgather_tensor(torch::full({1}, value), stats);
    float sum = all[0].item<float>();
    for (size_t i = 1; i < all.size(); ++i) sum += all[i].item<float>();
    return sum;
  }
  std::vector<torch::Tensor> alltoall(const std::vector<torch::Tensor>& to_rank, const std::vector<int64_t>&,
                                      train::CollectiveStats& stats) override {
    stats.calls += 1;
    return world_.exchange(rank_, to_rank);
  }
  torch::Tensor alltoall_rows(const torch::Tensor& rows, train::CollectiveStats& stats) override {
    std::vector<torch::Tensor> to;
    for (int64_t r = 0; r < rows.size(0); ++r) to.push_back(rows[r]);
    stats.calls += 1;
    return torch::stack(world_.exchange(rank_, to));
  }
  std::vector<torch::Tensor> allgather_tensor(const torch::Tensor& mine, train::CollectiveStats& stats) override {
    stats.calls += 1;
    return world_.exchange(rank_, std::vector<torch::Tensor>(static_cast<size_t>(world_.size()), mine));
  }
  std::vector<std::string> allgather(const std::string& mine) override { return world_.allgather(rank_, mine); }
  void barrier() override { world_.allgather(rank_, ""); }

 private:
  FakeWorld& world_;
  int rank_;
};

}  // namespace retrace::testing
