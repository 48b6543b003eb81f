// ckpt_bench: how fast a checkpoint is saved and loaded, next to the ceilings of this machine,
// measured in the same run on the same disk:
//   save     prepare_checkpoint_dir + write_shard (hash in the same pass) + commit_checkpoint
//   load     verify_checkpoint (sha256 of every shard) + load_shard (read and parse)
//   write    plain write(2) loop of the same bytes + fsync, to a fresh file in the same directory
//   sha256   OpenSSL EVP sha256 over the same bytes in memory
// Prints figures only (MB = 10^6 bytes); never fails for slowness.
//
//   ckpt_bench [DIR (default /tmp/retrace-ckpt-bench)] [MB (default 256)] [REPEATS (default 3)]
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/shard.h"
#include "core/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace retrace::ckpt;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void fill_random(std::vector<uint8_t>& buf, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(buf.data() + i, &x, 8);
  }
}

double plain_write_fsync(const std::string& path, const std::vector<std::vector<uint8_t>>& parts) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("open");
    std::exit(4);
  }
  for (const auto& p : parts) {
    for (size_t done = 0; done < p.size();) {
      ssize_t n = ::write(fd, p.data() + done, std::min<size_t>(8u << 20, p.size() - done));
      if (n <= 0) {
        std::perror("write");
        std::exit(4);
      }
      done += size_t(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
  double s = seconds_since(t0);
  ::unlink(path.c_str());
  return s;
}

double sha256_memory(const std::vector<std::vector<uint8_t>>& parts) {
  auto t0 = Clock::now();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const auto& p : parts) EVP_DigestUpdate(ctx, p.data(), p.size());
  unsigned char out[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, out, &len);
  EVP_MD_CTX_free(ctx);
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "/tmp/retrace-ckpt-bench";
  const uint64_t mb = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  try {
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
    // A model-like state: a few large tensors and some small ones.
    const uint64_t total = mb * 1000 * 1000;
    const std::vector<double> share = {0.5, 0.25, 0.1875, 0.0625};
    std::vector<std::vector<uint8_t>> parts;
    uint64_t used = 0;
    for (size_t i = 0; i < share.size(); ++i) {
      uint64_t n = (i + 1 == share.size() ? total - used : uint64_t(total * share[i])) / 4 * 4;
      parts.emplace_back(n);
      fill_random(parts.back(), 0x1234567 + i);
      used += n;
    }
    std::vector<uint8_t> small_a(4096), small_b(512);
    fill_random(small_a, 7);
    fill_random(small_b, 8);
    std::vector<TensorView> views;
    for (size_t i = 0; i < parts.size(); ++i)
      views.push_back({"layer" + std::to_string(i) + ".weight", "F32", {int64_t(parts[i].size() / 4)}, parts[i].data(),
                       parts[i].size()});
    views.push_back({"bias", "F32", {1024}, small_a.data(), 4096});
    views.push_back({"step", "I64", {64}, small_b.data(), 512});
    uint64_t bytes = 4096 + 512;
    for (const auto& p : parts) bytes += p.size();

    std::vector<double> save, load, write, sha;
    for (int r = 0; r < repeats; ++r) {
      // Interleaved, so that drift of the machine hits every figure alike.
      auto t0 = Clock::now();
      const uint64_t step = uint64_t(r + 1);
      const std::string dir = prepare_checkpoint_dir(root, step);
      ShardFileInfo info = write_shard(dir + "/" + shard_file_name(0), shard_metadata(step, 0, 1), views);
      Manifest m;
      m.step = step;
      m.world_size = 1;
      m.config_hash = "bench";
      m.shards = {{0, info.file, info.size, info.sha256}};
      commit_checkpoint(root, m, /*keep_last=*/1);
      save.push_back(seconds_since(t0));

      t0 = Clock::now();
      Manifest v = verify_checkpoint(dir, 1);
      ShardData d = load_shard(dir, v, 0, /*check_digest=*/false);
      load.push_back(seconds_since(t0));
      if (d.tensors.size() != views.size()) throw std::runtime_error("bench: wrong tensor count on load");

      write.push_back(plain_write_fsync(root + "/plain-write.bin", parts));
      sha.push_back(sha256_memory(parts));
    }
    auto rate = [&](double s) { return double(bytes) / 1e6 / s; };
    const double save_rate = rate(median(save)), load_rate = rate(median(load));
    const double write_rate = rate(median(write)), sha_rate = rate(median(sha));
    const double ceiling = std::min(write_rate, sha_rate);
    std::printf("state: %.1f MB in %zu tensors, %d repeats (medians), dir %s\n", double(bytes) / 1e6, views.size(),
                repeats, root.c_str());
    std::printf("save (write_shard + commit, sha256 in the same pass): %8.1f MB/s\n", save_rate);
    std::printf("load (verify sha256 + read + parse):                  %8.1f MB/s\n", load_rate);
    std::printf("ceiling: sequential write + fsync, same disk:         %8.1f MB/s\n", write_rate);
    std::printf("ceiling: sha256 in memory (OpenSSL EVP):              %8.1f MB/s\n", sha_rate);
    std::printf("save / min(ceilings) = %.2f\n", save_rate / ceiling);
    std::filesystem::remove_all(root);
  } catch (const retrace::Error& e) {
    std::fprintf(stderr, "ckpt_bench: %s: %s\n", e.kind(), e.what());
    return int(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_bench: %s\n", e.what());
    return 70;
  }
  return 0;
}
