// RapidCheck properties of the checkpoint format. A failing case prints its seed; rerun it with
// RC_PARAMS="seed=<seed>".
#include <rapidcheck.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/ckpt_test_util.h"
#include "ckpt/manifest.h"
#include "ckpt/shard.h"
#include "ckpt/verify.h"
#include "core/digest.h"
#include "core/error.h"

using namespace retrace;
using namespace retrace::ckpt;

namespace {

const std::vector<std::string> kDtypes = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"};

struct RandomTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

rc::Gen<std::vector<RandomTensor>> gen_tensors() {
  return rc::gen::exec([] {
    const int n = *rc::gen::inRange(0, 8);
    std::set<std::string> names;
    std::vector<RandomTensor> out;
    for (int i = 0; i < n; ++i) {
      RandomTensor t;
      t.name = *rc::gen::nonEmpty(rc::gen::container<std::string>(rc::gen::inRange<char>(32, 127)));
      if (t.name == "__metadata__" || !names.insert(t.name).second) continue;
      t.dtype = *rc::gen::elementOf(kDtypes);
      const int rank = *rc::gen::inRange(0, 4);
      uint64_t count = 1;
      for (int d = 0; d < rank; ++d) {
        t.shape.push_back(*rc::gen::inRange<int64_t>(0, 9));
        count *= uint64_t(t.shape.back());
      }
      t.bytes = *rc::gen::container<std::vector<uint8_t>>(count * *dtype_size(t.dtype), rc::gen::arbitrary<uint8_t>());
      out.push_back(std::move(t));
    }
    return out;
  });
}

std::vector<TensorView> views_of(const std::vector<RandomTensor>& ts) {
  std::vector<TensorView> v;
  for (const auto& t : ts) v.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return v;
}

}  // namespace

int main() {
  ckpt::testing::TempDir tmp("props");
  bool ok = true;

  ok &= rc::check("random shards round trip bitwise", [&] {
    const auto tensors = *gen_tensors();
    const auto metadata = *rc::gen::container<std::map<std::string, std::string>>(rc::gen::container<std::string>(
                                                                                      rc::gen::inRange<char>(32, 127)),
                                                                                  rc::gen::container<std::string>(
                                                                                      rc::gen::inRange<char>(32, 127)));
    const std::string path = tmp.file("rt.safetensors");
    ShardFileInfo info = write_shard(path, metadata, views_of(tensors));
    RC_ASSERT(info.size == std::filesystem::file_size(path));
    ShardData d = read_shard(path);
    RC_ASSERT(d.metadata == metadata);
    RC_ASSERT(d.tensors.size() == tensors.size());
    RC_ASSERT(d.data_start % 8 == 0);
    for (const auto& t : tensors) {
      const TensorEntry* e = d.find(t.name);
      RC_ASSERT(e != nullptr);
      RC_ASSERT(e->dtype == t.dtype);
      RC_ASSERT(e->shape == t.shape);
      RC_ASSERT(e->nbytes == t.bytes.size());
      RC_ASSERT(t.bytes.empty() || std::memcmp(d.data(*e), t.bytes.data(), t.bytes.size()) == 0);
    }
  });

  // One small checkpoint, damaged in random ways; restored after each case.
  const std::string root = tmp.file("ck");
  const std::string dir = ckpt::testing::save_checkpoint(root, 10, 3, 200);
  const std::string manifest_path = dir + "/manifest.json";
  const std::string manifest_good = ckpt::testing::read_all(manifest_path);

  ok &= rc::check("a flipped or truncated shard is always a sha256 mismatch on its rank", [&] {
    const uint32_t rank = *rc::gen::inRange<uint32_t>(0, 3);
    const std::string path = dir + "/" + shard_file_name(rank);
    const std::string good = ckpt::testing::read_all(path);
    std::string bad = good;
    if (*rc::gen::arbitrary<bool>()) {
      const size_t at = *rc::gen::inRange<size_t>(0, good.size());
      bad[at] = char(bad[at] ^ *rc::gen::inRange<int>(1, 256));
    } else {
      bad.resize(*rc::gen::inRange<size_t>(0, good.size()));
    }
    ckpt::testing::write_all(path, bad);
    std::string what;
    try {
      verify_checkpoint(dir, 3);
    } catch (const IntegrityError& e) {
      what = e.what();
    }
    ckpt::testing::write_all(path, good);
    RC_ASSERT(what.rfind("sha256 mismatch on rank " + std::to_string(rank), 0) == 0);
  });

  ok &= rc::check("a damaged manifest is rejected unless only its whitespace changed", [&] {
    std::string bad = manifest_good;
    const int edits = *rc::gen::inRange(1, 4);
    std::set<size_t> positions;
    for (int i = 0; i < edits; ++i) {
      const size_t at = *rc::gen::inRange<size_t>(0, bad.size());
      bad[at] = char(bad[at] ^ *rc::gen::inRange<int>(1, 256));
      positions.insert(at);
    }
    if (*rc::gen::arbitrary<bool>()) bad.resize(*rc::gen::inRange<size_t>(0, bad.size()));
    ckpt::testing::write_all(manifest_path, bad);
    bool rejected = false;
    Manifest got;
    try {
      got = verify_checkpoint(dir, 3);
    } catch (const IntegrityError& e) {
      rejected = true;
      const std::string what = e.what();
      RC_ASSERT(what.rfind("manifest checksum mismatch", 0) == 0 || what.rfind("no manifest", 0) == 0);
    } catch (const FormatError&) {
      rejected = true;
    }
    ckpt::testing::write_all(manifest_path, manifest_good);
    if (!rejected) {
      auto is_ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
      for (size_t at : positions) RC_ASSERT(at >= bad.size() || (is_ws(bad[at]) && is_ws(manifest_good[at])));
      RC_ASSERT(serialize_manifest(got) == manifest_good);
    }
  });

  ok &= rc::check("parse_shard never crashes on damaged shards and keeps its bounds", [&] {
    std::string bytes = ckpt::testing::read_all(dir + "/" + shard_file_name(0));
    const int edits = *rc::gen::inRange(1, 6);
    for (int i = 0; i < edits; ++i) {
      const size_t at = *rc::gen::inRange<size_t>(0, bytes.size());
      bytes[at] = *rc::gen::arbitrary<char>();
    }
    try {
      ShardData d = parse_shard(bytes, "damaged");
      uint64_t total = 0;
      for (const auto& e : d.tensors) total += e.nbytes;
      RC_ASSERT(d.data_start + total == d.bytes.size());
    } catch (const FormatError&) {}
  });

  // One copy of the replicated state on disk: random tensors written by N in 1..8 ranks, each
  // writing its range, are read back bitwise from the pieces, and the split partitions every
  // tensor's elements with no rank over its share by more than one element.
  ok &= rc::check("a checkpoint split among N ranks reads back the same tensors bitwise", [&] {
    const auto tensors = *gen_tensors();
    const uint32_t world = *rc::gen::inRange(1u, 9u);
    std::vector<TensorLayout> layouts;
    std::vector<std::vector<char>> values;
    for (const auto& t : tensors) {
      layouts.push_back({t.name, t.dtype, t.shape, {}});
      values.emplace_back(t.bytes.begin(), t.bytes.end());
    }
    const auto split = split_among_ranks(layouts, world);
    uint64_t total = 0;
    std::vector<uint64_t> per_rank(world, 0);
    for (const auto& t : split) {
      uint64_t next = 0;
      for (const auto& p : t.pieces) {
        RC_ASSERT(p.begin == next && p.end > p.begin && p.rank < world);
        per_rank[p.rank] += (p.end - p.begin) * *dtype_size(t.dtype);
        next = p.end;
      }
      RC_ASSERT(next == t.numel());
      total += t.numel() * *dtype_size(t.dtype);
    }
    for (uint64_t b : per_rank) RC_ASSERT(b <= total / world + 8);
    const std::string root = tmp.file("split");
    std::filesystem::remove_all(root);
    const std::string dir = ckpt::testing::write_sharded(root, 1, world, layouts, values);
    std::string rng;
    const uint32_t own = *rc::gen::inRange(0u, world);
    RC_ASSERT(ckpt::testing::read_sharded(dir, own, &rng) == values);
    RC_ASSERT(rng == "rng of rank " + std::to_string(own));
  });

  // Sharded state digests its ranges apart: for a tensor of any dtype split into N in 1..8
  // ranges at any points (aligned or not), the per-range mixed sums add up to the whole tensor's.
  ok &= rc::check("mixed sums of a tensor's ranges add up to the whole tensor's", [&] {
    const auto tensors = *gen_tensors();
    for (const auto& t : tensors) {
      const size_t size = *dtype_size(t.dtype);
      const uint64_t count = t.bytes.size() / size;
      const uint64_t whole = mixed_sum(t.bytes.data(), size, count, 0);
      const int n = *rc::gen::inRange(1, 9);
      std::vector<uint64_t> cuts = {0, count};
      for (int i = 1; i < n; ++i) cuts.push_back(*rc::gen::inRange<uint64_t>(0, count + 1));
      std::sort(cuts.begin(), cuts.end());
      uint64_t sum = 0;
      for (size_t i = 0; i + 1 < cuts.size(); ++i)
        sum += mixed_sum(t.bytes.data() + cuts[i] * size, size, cuts[i + 1] - cuts[i], cuts[i]);
      RC_ASSERT(sum == whole);
    }
  });

  return ok ? 0 : 1;
}
