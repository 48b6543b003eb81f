// ckpt_bench: how fast a checkpoint is saved and loaded, next to the ceilings of this machine,
// measured in the same run on the same disk, interleaved round by round:
//   save     prepare_checkpoint_dir + write_shard (hash in the same pass, then read back by xxh3) +
//            commit_checkpoint (manifest, sizes: the shards were read back by their writer)
//   load     what a resume does: verify_checkpoint for the other ranks + load_shard, which reads
//            the shard and hashes it in the same pass, then parses it
//   read     plain read(2) of the same shard file into memory, nothing else
//   sha256   OpenSSL EVP sha256 over the same bytes in memory, one thread
//   write    plain write(2) loop of the same bytes + fsync, to a fresh file in the same directory
// load and read run twice: from the page cache (warm, as right after a save) and after
// posix_fadvise(DONTNEED) has dropped the file's pages (cold: from the disk, where the VM lets
// the advice through). A 4-rank checkpoint of the same total size then measures verify_checkpoint
// of all shards, which hashes them in parallel, against one thread's sha256. Last, the same state
// as a 4-rank checkpoint with a table (ckpt.v3: every tensor split among the shards, each piece
// with its offset and xxh3), read cold by rank 0 three ways, A B C each round: everything, pieces
// of other shards read by range and checked by xxh3 (v3); everything, every shard read whole and
// hashed (the ckpt.v2 path); and what a ZeRO rank keeps (the "model/" tensors whole, of the
// "optim/" ones what it wrote), with the bytes each read.
// Prints figures and per-round ratios (median [min, max]); never fails for slowness.
// MB = 10^6 bytes.
//
//   ckpt_bench [DIR (default /tmp/retrace-ckpt-bench)] [MB (default 256)] [REPEATS (default 5)]
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

#include "../../tools/bench/bench_stats.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/shard.h"
#include "ckpt/verify.h"
#include "core/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace retrace::ckpt;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(const std::vector<double>& v) { return retrace::bench::spread(v).median; }

// Drops the file's pages from the page cache (they are clean: the save fsynced them).
void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double plain_read(const std::string& path, std::vector<char>& buf) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::perror("open");
    std::exit(4);
  }
  size_t done = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data() + done, buf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  return seconds_since(t0);
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
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
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
      views.push_back({"layer" + std::to_string(i) + ".weight",
                       "F32",
                       {int64_t(parts[i].size() / 4)},
                       parts[i].data(),
                       parts[i].size()});
    views.push_back({"bias", "F32", {1024}, small_a.data(), 4096});
    views.push_back({"step", "I64", {64}, small_b.data(), 512});
    uint64_t bytes = 4096 + 512;
    for (const auto& p : parts) bytes += p.size();

    std::vector<double> save, load, load_cold, read, read_cold, write, sha, multi, ranged, whole, zero;
    std::vector<double> r_load, r_cold, r_multi, r_save, r_ranged, r_whole, r_speedup;  // per-round ratios
    uint64_t ranged_bytes = 0, whole_bytes = 0, zero_bytes = 0, sharded_bytes = 0;
    const std::string sharded_root = root + "/four-ranks-table";
    std::vector<char> read_buf;
    const std::string multi_root = root + "/four-ranks";
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
      commit_checkpoint(root, m, /*keep_last=*/1, nullptr, /*shards_read_back=*/true);
      save.push_back(seconds_since(t0));
      const std::string shard_path = dir + "/" + info.file;
      read_buf.resize(info.size);

      auto timed_load = [&] {
        auto t = Clock::now();
        Manifest v = verify_checkpoint(dir, 1, /*hashed_by_caller=*/0);
        ShardData d = load_shard(dir, v, 0, /*check_digest=*/true);
        const double s = seconds_since(t);
        if (d.tensors.size() != views.size()) throw std::runtime_error("bench: wrong tensor count on load");
        return s;
      };
      load.push_back(timed_load());
      read.push_back(plain_read(shard_path, read_buf));
      sha.push_back(sha256_memory(parts));
      drop_cache(shard_path);
      load_cold.push_back(timed_load());
      drop_cache(shard_path);
      read_cold.push_back(plain_read(shard_path, read_buf));
      write.push_back(plain_write_fsync(root + "/plain-write.bin", parts));
      r_load.push_back(sha.back() > read.back() ? sha.back() / load.back() : read.back() / load.back());
      r_cold.push_back(std::max(sha.back(), read_cold.back()) / load_cold.back());
      // The save reads the checkpoint back and verifies it before rotating: its time is all of that.
      r_save.push_back(std::max(sha.back(), write.back()) / save.back());

      // Four ranks' shards of a quarter each, verified together.
      const std::string mdir = prepare_checkpoint_dir(multi_root, step);
      Manifest mm;
      mm.step = step;
      mm.world_size = 4;
      mm.config_hash = "bench";
      for (uint32_t rank = 0; rank < 4; ++rank) {
        std::vector<TensorView> quarter;
        for (const TensorView& tv : views) {
          const int64_t n = tv.shape[0] / 4;
          quarter.push_back({tv.name,
                             tv.dtype,
                             {n},
                             static_cast<const uint8_t*>(tv.data) + rank * (tv.nbytes / 4),
                             uint64_t(n) * (tv.nbytes / uint64_t(tv.shape[0]))});
        }
        ShardFileInfo qi = write_shard(mdir + "/" + shard_file_name(rank), shard_metadata(step, rank, 4), quarter);
        mm.shards.push_back({rank, qi.file, qi.size, qi.sha256});
      }
      commit_checkpoint(multi_root, mm, /*keep_last=*/1, nullptr, /*shards_read_back=*/true);
      t0 = Clock::now();
      verify_checkpoint(mdir, 4);
      multi.push_back(seconds_since(t0));
      r_multi.push_back(sha.back() / multi.back());

      // The same state as a 4-rank checkpoint with a table (ckpt.v3).
      std::vector<TensorLayout> table;
      for (size_t i = 0; i < views.size(); ++i)
        table.push_back({(i % 2 == 0 ? "model/" : "optim/") + views[i].name, views[i].dtype, views[i].shape, {}});
      table = split_among_ranks(std::move(table), 4);
      const std::string sdir = prepare_checkpoint_dir(sharded_root, step);
      Manifest sm;
      sm.step = step;
      sm.world_size = 4;
      sm.config_hash = "bench";
      sm.tensors = table;
      std::vector<PieceRecord> records;
      for (uint32_t rank = 0; rank < 4; ++rank) {
        std::vector<TensorView> mine;
        std::vector<std::pair<std::string, uint64_t>> names;
        for (size_t i = 0; i < table.size(); ++i)
          for (const TensorPiece& p : table[i].pieces)
            if (p.rank == rank) {
              mine.push_back(piece_view(table[i], p, views[i].data));
              names.emplace_back(table[i].name, p.begin);
            }
        ShardFileInfo qi = write_shard(sdir + "/" + shard_file_name(rank), shard_metadata(step, rank, 4), mine);
        sm.shards.push_back({rank, qi.file, qi.size, qi.sha256});
        for (size_t v = 0; v < names.size(); ++v)
          records.push_back({names[v].first, rank, names[v].second, qi.offsets[v], qi.xxh3[v]});
      }
      set_piece_records(sm.tensors, records, sdir);
      commit_checkpoint(sharded_root, sm, /*keep_last=*/1, nullptr, /*shards_read_back=*/true);
      const Manifest v3 = verify_checkpoint(sdir, 4, kEveryShard);
      Manifest v2 = v3;
      for (TensorLayout& t : v2.tensors)
        for (TensorPiece& p : t.pieces) p.xxh3.clear();
      sharded_bytes = 0;
      for (const ShardEntry& e : v3.shards) sharded_bytes += e.size;
      std::vector<std::vector<char>> dest(table.size());
      for (size_t i = 0; i < table.size(); ++i) dest[i].resize(views[i].nbytes);
      auto timed_pieces = [&](const Manifest& mf, bool zero_rank, uint64_t& got) {
        for (const ShardEntry& e : mf.shards) drop_cache(sdir + "/" + e.file);
        const auto t = Clock::now();
        got = read_pieces(
            sdir, mf, [](const TensorLayout&) { return true; },
            [&](size_t i) { return static_cast<void*>(dest[i].data()); }, 0,
            [](const ShardData&, const std::map<std::string, std::string>&) {},
            [&](size_t i) {
              // A ZeRO rank keeps of an optimizer tensor the elements it wrote: its own pieces.
              const TensorLayout& t = mf.tensors[i];
              if (!zero_rank || t.name.rfind("optim/", 0) != 0) return std::pair<uint64_t, uint64_t>{0, t.numel()};
              for (const TensorPiece& p : t.pieces)
                if (p.rank == 0) return std::pair<uint64_t, uint64_t>{p.begin, p.end};
              return std::pair<uint64_t, uint64_t>{0, 0};
            });
        return seconds_since(t);
      };
      ranged.push_back(timed_pieces(v3, false, ranged_bytes));
      whole.push_back(timed_pieces(v2, false, whole_bytes));
      zero.push_back(timed_pieces(v3, true, zero_bytes));
      r_ranged.push_back(std::max(sha.back(), read_cold.back()) / ranged.back());
      r_whole.push_back(std::max(sha.back(), read_cold.back()) / whole.back());
      r_speedup.push_back(whole.back() / ranged.back());
    }
    auto rate = [&](double s) { return double(bytes) / 1e6 / s; };
    auto ratio = [](const char* what, const std::vector<double>& v) {
      const auto s = retrace::bench::spread(v);
      std::printf("%-58s %5.2f [%.2f, %.2f]\n", what, s.median, s.lo, s.hi);
    };
    const double write_rate = rate(median(write)), sha_rate = rate(median(sha));
    std::printf("state: %.1f MB in %zu tensors, %d rounds (medians), dir %s\n", double(bytes) / 1e6, views.size(),
                repeats, root.c_str());
    std::printf("save (write_shard + commit, sha256 in the same pass):  %8.1f MB/s\n", rate(median(save)));
    std::printf("load, warm (read + sha256 in one pass + parse):         %8.1f MB/s\n", rate(median(load)));
    std::printf("load, cold (pages dropped first):                       %8.1f MB/s\n", rate(median(load_cold)));
    std::printf("4-rank verify (all shards, hashed in parallel):         %8.1f MB/s\n", rate(median(multi)));
    std::printf("ceiling: plain read, warm:                              %8.1f MB/s\n", rate(median(read)));
    std::printf("ceiling: plain read, cold:                              %8.1f MB/s\n", rate(median(read_cold)));
    std::printf("ceiling: sha256 in memory (OpenSSL EVP, one thread):    %8.1f MB/s\n", sha_rate);
    std::printf("ceiling: sequential write + fsync, same disk:           %8.1f MB/s\n", write_rate);
    std::printf("per-round ratios, median [min, max]:\n");
    ratio("  load warm / min(read warm, sha256)", r_load);
    ratio("  load cold / min(read cold, sha256)", r_cold);
    ratio("  4-rank verify / sha256 (one thread)", r_multi);
    ratio("  save / min(write + fsync, sha256)", r_save);
    std::printf("4-rank checkpoint with a table, %.1f MB of shards, read cold by rank 0:\n",
                double(sharded_bytes) / 1e6);
    std::printf("  everything, other shards by range + xxh3 (ckpt.v3):  %8.1f MB/s, %.1f MB read\n",
                double(ranged_bytes) / 1e6 / median(ranged), double(ranged_bytes) / 1e6);
    std::printf("  everything, every shard whole + sha256 (ckpt.v2):    %8.1f MB/s, %.1f MB read\n",
                double(whole_bytes) / 1e6 / median(whole), double(whole_bytes) / 1e6);
    std::printf("  a ZeRO rank's part (model whole, its optim pieces):  %8.3f s, %.1f MB read (%.3f of the shards)\n",
                median(zero), double(zero_bytes) / 1e6, double(zero_bytes) / double(sharded_bytes));
    ratio("  v3 everything / min(read cold, sha256) of the same bytes", r_ranged);
    ratio("  v2 everything / min(read cold, sha256) of the same bytes", r_whole);
    ratio("  time v2 / time v3 (everything)", r_speedup);
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
