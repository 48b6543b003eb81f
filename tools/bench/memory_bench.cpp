// Step time and memory growth of the GPT under each activation-checkpoint policy.
//
// Every (policy, round) runs in a fresh child process (fork), so one policy's allocations cannot
// hide another's: the child builds the model and the batch, notes its peak RSS (ru_maxrss), runs
// one warm-up step and `steps` timed steps (forward + backward), and sends back the growth of the
// peak RSS during the steps and the median step time. Rounds interleave the policies; the table
// shows medians over rounds. Timings on shared machines move by 20-30 %: read the ratios.
//
// glibc malloc keeps freed memory mapped, which hides the checkpointing saving in peak RSS; run
// with LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 to see it (MACHINE-FACTS.md).
//
//   memory_bench [corpus] [rounds=2] [steps=3] [threads=1] [batch=32] [dropout=0.1]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/text_corpus.h"
#include "model/gpt.h"

namespace {

struct Config {
  std::string name;
  std::string policy;
  int64_t every;
};

struct ChildResult {
  double rss_growth_mib = 0;
  double rss_peak_mib = 0;
  double median_ms = 0;
  double loss = 0;
  int ok = 0;
};

double maxrss_mib() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

ChildResult run_child(const Config& config, const std::string& corpus_path, int steps, int threads, int64_t batch,
                      double dropout) {
  torch::set_num_threads(threads);
  torch::manual_seed(42);
  const retrace::data::TextCorpus corpus = retrace::data::load_text_corpus(corpus_path, 128, 0.1);
  retrace::model::GptOptions options;
  options.vocab_size = corpus.vocab_size;
  options.checkpoint = config.policy;
  options.dropout = dropout;
  options.checkpoint_every = config.every;
  retrace::model::Gpt model(options);
  model->train();
  const torch::Tensor x = corpus.train_inputs.slice(0, 0, batch);
  const torch::Tensor y = corpus.train_targets.slice(0, 0, batch);
  ChildResult r;
  const double before = maxrss_mib();
  std::vector<double> times;
  for (int i = 0; i <= steps; ++i) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor logits = model->forward(x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, corpus.vocab_size}), y.reshape({-1}));
    loss.backward();
    const auto t1 = std::chrono::steady_clock::now();
    if (i > 0) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    r.loss = loss.item<double>();
  }
  r.rss_peak_mib = maxrss_mib();
  r.rss_growth_mib = r.rss_peak_mib - before;
  r.median_ms = median(times);
  r.ok = 1;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string corpus = argc > 1 ? argv[1] : retrace::data::kDefaultTextCorpus;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  const int64_t batch = argc > 5 ? std::atoll(argv[5]) : 32;
  const double dropout = argc > 6 ? std::atof(argv[6]) : 0.1;
  const std::vector<Config> configs = {
      {"none", "none", 4}, {"full k=4", "full", 4}, {"full k=1", "full", 1},
      {"sqrt (k=3)", "sqrt", 4}, {"selective", "selective", 4}};
  const char* preload = std::getenv("LD_PRELOAD");
  std::printf("memory_bench: gpt d_model=128 n_layers=8 n_heads=4 context=128 batch=%lld dropout=%g, "
              "torch threads %d, %d rounds x %d steps, allocator %s\n",
              static_cast<long long>(batch), dropout, threads, rounds, steps, preload ? preload : "glibc malloc");

  std::vector<std::vector<ChildResult>> results(configs.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t c = 0; c < configs.size(); ++c) {
      int fds[2];
      if (pipe(fds) != 0) return 4;
      const pid_t pid = fork();
      if (pid < 0) return 4;
      if (pid == 0) {
        close(fds[0]);
        ChildResult r;
        try {
          r = run_child(configs[c], corpus, steps, threads, batch, dropout);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: %s\n", configs[c].name.c_str(), e.what());
        }
        const ssize_t n = write(fds[1], &r, sizeof r);
        _exit(n == static_cast<ssize_t>(sizeof r) ? 0 : 1);
      }
      close(fds[1]);
      ChildResult r;
      const ssize_t n = read(fds[0], &r, sizeof r);
      close(fds[0]);
      int status = 0;
      waitpid(pid, &status, 0);
      if (n != static_cast<ssize_t>(sizeof r) || !r.ok) {
        std::fprintf(stderr, "%s: child failed\n", configs[c].name.c_str());
        return 1;
      }
      results[c].push_back(r);
    }
  }

  auto med = [&](size_t c, double ChildResult::*field) {
    std::vector<double> v;
    for (const auto& r : results[c]) v.push_back(r.*field);
    return median(v);
  };
  const double base_ms = med(0, &ChildResult::median_ms);
  const double base_growth = med(0, &ChildResult::rss_growth_mib);
  std::printf("%-12s %10s %8s %12s %8s %12s %10s\n", "policy", "step ms", "x none", "growth MiB", "x none",
              "peak MiB", "loss");
  for (size_t c = 0; c < configs.size(); ++c) {
    const double ms = med(c, &ChildResult::median_ms);
    const double growth = med(c, &ChildResult::rss_growth_mib);
    std::printf("%-12s %10.1f %8.2f %12.1f %8.2f %12.1f %10.6f\n", configs[c].name.c_str(), ms, ms / base_ms, growth,
                base_growth > 0 ? growth / base_growth : 0.0, med(c, &ChildResult::rss_peak_mib),
                results[c].front().loss);
  }
  return 0;
}
