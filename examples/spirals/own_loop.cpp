// spirals_own_loop: a plain LibTorch training loop of its own, recorded with retrace::Recorder.
//   spirals_own_loop OUT_DIR [--steps N] [--crash-after K]   train, trace every step, checkpoint every 10
//   spirals_own_loop OUT_DIR --resume [--steps N]            continue from the newest good checkpoint
// Two runs give traces that `retrace diff` finds identical; a resumed run's trace continues the chain.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "spirals.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [--steps N] [--crash-after K] [--resume]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  int64_t steps = 30, crash_after = 0;
  bool resume = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--crash-after") && i + 1 < argc) crash_after = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--resume")) resume = true;
  }
  try {
    torch::manual_seed(3);
    const retrace::Dataset data = spirals::make_spirals(3, 100, 0, 11);
    spirals::ResMlp model(2, 16, 1, 3);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
    retrace::RecorderOptions options;
    options.seed = 3;
    options.config_toml = "steps = " + std::to_string(steps) + "\nbatch = 50\nlr = 0.01\n";
    options.force = true;
    retrace::Recorder rec = resume ? retrace::Recorder::resume(out, *model, optimizer)
                                   : retrace::Recorder::create(out, *model, options);
    const int64_t n = data.train.inputs.size(0), batch = 50;
    for (int64_t step = static_cast<int64_t>(rec.last_step()) + 1; step <= steps; ++step) {
      // The batch is a pure function of the step, so a resumed loop sees the same batches.
      const int64_t start = ((step - 1) * batch) % n;
      const auto x = data.train.inputs.slice(0, start, start + batch);
      const auto y = data.train.targets.slice(0, start, start + batch);
      optimizer.zero_grad();
      const auto loss = spirals::smoothed_cross_entropy_sum(model->forward(x), y, 0.0) / batch;
      loss.backward();
      optimizer.step();
      retrace::StepInfo info;
      info.lr = 0.01;
      info.batch_size = static_cast<uint32_t>(batch);
      rec.step(static_cast<uint64_t>(step), loss.item<float>(), *model, optimizer, info);
      if (step % 10 == 0) rec.checkpoint(static_cast<uint64_t>(step), *model, optimizer);
      if (step == crash_after) {
        rec.sync();
        std::raise(SIGKILL);  // as if the machine went away
      }
    }
    rec.sync();
    std::printf("own loop: %lld steps in %s\n", static_cast<long long>(steps), out.c_str());
    return 0;
  } catch (const retrace::Error& e) {
    std::fprintf(stderr, "spirals_own_loop: %s: %s\n", e.kind(), e.what());
    return static_cast<int>(e.exit_code());
  }
}
