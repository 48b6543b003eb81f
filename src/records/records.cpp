#include "records/records.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/le.h"

namespace retrace::records {

bool is_numerics_key(const std::string& key) {
  return key.rfind("info.", 0) != 0 && key.rfind("env.", 0) != 0 && key != "allocator" && key != "cuda_device_count";
}

std::vector<KeyValue> numerics_fields(const std::vector<KeyValue>& fingerprint) {
  std::vector<KeyValue> out;
  for (const auto& kv : fingerprint)
    if (is_numerics_key(kv.key)) out.push_back(kv);
  return out;
}

std::vector<std::string> numerics_differences(const std::vector<KeyValue>& a, const std::vector<KeyValue>& b) {
  std::map<std::string, std::string> ma, mb;
  for (const auto& kv : numerics_fields(a)) ma[kv.key] = kv.value;
  for (const auto& kv : numerics_fields(b)) mb[kv.key] = kv.value;
  std::vector<std::string> keys;
  for (const auto& [k, v] : ma)
    if (auto it = mb.find(k); it == mb.end() || it->second != v) keys.push_back(k);
  for (const auto& [k, v] : mb)
    if (!ma.count(k)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const char* skip_text(SkipReason reason) {
  switch (reason) {
    case SkipReason::kNone: return "";
    case SkipReason::kNonFiniteLoss: return "non_finite_loss";
    case SkipReason::kNonFiniteGrad: return "non_finite_grad";
    case SkipReason::kLossSpike: return "loss_spike";
    case SkipReason::kOther: break;
  }
  return "other";
}

SkipReason skip_reason_of(const std::string& text) {
  for (SkipReason r : {SkipReason::kNone, SkipReason::kNonFiniteLoss, SkipReason::kNonFiniteGrad, SkipReason::kLossSpike})
    if (text == skip_text(r)) return r;
  return SkipReason::kOther;
}

namespace {

// Builds the canonical byte string of a record: fixed-width little-endian scalars, doubles by
// their bit pattern, strings length-prefixed, vectors count-prefixed. Hashing one contiguous
// buffer is faster than streaming many 8-byte updates.
class Canonical {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    uint8_t b[4];
    put_u32(b, v);
    bytes_.append(reinterpret_cast<const char*>(b), 4);
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    put_u64(b, v);
    bytes_.append(reinterpret_cast<const char*>(b), 8);
  }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  }
  void digest(const Digest128& d) {
    u64(d.hi);
    u64(d.lo);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes_.append(s);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

}  // namespace

Digest128 content_digest(const StepRecord& r) {
  Canonical c;
  c.u64(r.step);
  c.u64(r.epoch);
  c.u64(r.batch_in_epoch);
  c.u32(r.batch_size);
  c.digest(r.sample_digest);
  c.f64(r.loss);
  c.u32(r.loss_bits);
  c.f64(r.grad_norm_pre);
  c.f64(r.grad_norm_post);
  c.f64(r.lr);
  c.f64(r.loss_scale);
  c.u8(static_cast<uint8_t>(r.outcome));
  c.str(r.skip_reason);
  c.digest(r.param_digest);
  c.digest(r.optim_digest);
  c.digest(r.rng_digest);
  c.u64(r.micro_batch_sizes.size());
  for (uint32_t v : r.micro_batch_sizes) c.u32(v);
  c.u64(r.micro_losses.size());
  for (double v : r.micro_losses) c.f64(v);
  c.u64(r.rank_grad_digests.size());
  for (const Digest128& d : r.rank_grad_digests) c.digest(d);
  if (r.state_digest != Digest128{}) {
    c.u8(1);
    c.digest(r.state_digest);
  }
  if (!r.rank_rng_digests.empty()) {
    c.u8(2);
    c.u64(r.rank_rng_digests.size());
    for (const Digest128& d : r.rank_rng_digests) c.digest(d);
  }
  if (r.grad_digest != Digest128{}) {
    c.u8(3);
    c.digest(r.grad_digest);
  }
  if (!r.module_digests.empty()) {
    c.u8(4);
    c.u64(r.module_digests.size());
    for (const ModuleDigest& m : r.module_digests) {
      c.str(m.module);
      c.digest(m.param);
      c.digest(m.grad);
      c.digest(m.optim);
    }
  }
  return xxh3_128(c.bytes().data(), c.bytes().size());
}

bool is_process_event(const EventRecord& e) {
  return e.kind == "resume" || e.kind == "crash" || e.kind == "checkpoint";
}

Digest128 chain_digest(const Digest128& previous_chain, const Digest128& content) {
  uint8_t b[32];
  put_u64(b, previous_chain.hi);
  put_u64(b + 8, previous_chain.lo);
  put_u64(b + 16, content.hi);
  put_u64(b + 24, content.lo);
  return xxh3_128(b, sizeof(b));
}

}  // namespace retrace::records
