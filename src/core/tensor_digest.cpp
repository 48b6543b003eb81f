#include "core/tensor_digest.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace retrace {

namespace {
constexpr uint64_t kUndefinedTag = 0xffffffffffffffffull;

// Feeds a hasher and, when given, a second one the same words.
struct Feed {
  Xxh3& h;
  Xxh3* also;
  void u64(uint64_t v) {
    h.update_u64(v);
    if (also) also->update_u64(v);
  }
  void bytes(const void* p, size_t n) {
    h.update(p, n);
    if (also) also->update(p, n);
  }
};

void header_into(Feed& f, torch::ScalarType dtype, c10::IntArrayRef shape) {
  f.u64(static_cast<uint64_t>(dtype));
  f.u64(static_cast<uint64_t>(shape.size()));
  for (int64_t s : shape) f.u64(static_cast<uint64_t>(s));
}
}  // namespace

void digest_tensor_into(Xxh3& h, const torch::Tensor& t, DigestKind kind, const KnownSums* known, Xxh3* also) {
  Feed f{h, also};
  if (!t.defined()) {
    f.u64(kUndefinedTag);
    return;
  }
  header_into(f, t.scalar_type(), t.sizes());
  if (is_mixed(kind)) {
    uint64_t known_sum[16];
    f.u64(known && (*known)(t, known_sum) ? known_sum[0] : tensor_mixed_sum(t, 0, mix_of(kind)));
    return;
  }
  torch::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(torch::kCPU).contiguous();
  if (kind == DigestKind::kXxh3) {
    f.bytes(c.data_ptr(), c.nbytes());
    return;
  }
  uint64_t sums[16];
  if (!known || !(*known)(c, sums)) lane_sums(c.data_ptr(), c.nbytes(), sums);
  f.u64(c.nbytes());
  for (uint64_t s : sums) f.u64(s);
}

Digest128 digest_named(NamedTensors tensors, DigestKind kind, const KnownSums* known, DigestParts* parts) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  Xxh3 h;
  if (parts) parts->clear();
  for (const auto& [name, t] : tensors) {
    Xxh3 part;
    Feed f{h, parts ? &part : nullptr};
    f.u64(name.size());
    f.bytes(name.data(), name.size());
    digest_tensor_into(h, t, kind, known, parts ? &part : nullptr);
    if (parts) parts->emplace_back(name, part.digest());
  }
  return h.digest();
}

namespace {

// The 64-bit constants of mix_position_word as the int64 values of the same bits.
int64_t as_signed(uint64_t v) {
  int64_t s;
  std::memcpy(&s, &v, sizeof s);
  return s;
}

// z >> s as an unsigned shift: torch's right shift of int64 is arithmetic.
torch::Tensor shift_right_logical(const torch::Tensor& z, int s) {
  return z.__rshift__(s).bitwise_and_(as_signed((uint64_t{1} << (64 - s)) - 1));
}

}  // namespace

uint64_t mixed_sum_on_device(const torch::Tensor& t, uint64_t first_position, Mix mix) {
  if (!t.defined() || t.numel() == 0) return 0;
  const int64_t size = static_cast<int64_t>(t.element_size());
  torch::ScalarType word_type;
  switch (size) {
    case 1: word_type = torch::kUInt8; break;
    case 2: word_type = torch::kInt16; break;
    case 4: word_type = torch::kInt32; break;
    case 8: word_type = torch::kInt64; break;
    default: RETRACE_FAIL(InvariantError, "mixed_sum_on_device: element size ", size, " is not 1, 2, 4 or 8");
  }
  const torch::Tensor flat = t.contiguous().view({-1});
  const torch::Tensor words_all = t.scalar_type() == word_type ? flat : flat.view(word_type);
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(t.device());
  // Zero-extension of the signed 16- and 32-bit views.
  const int64_t mask = size == 8 ? -1 : as_signed((uint64_t{1} << (8 * size)) - 1);
  constexpr int64_t kChunk = int64_t{1} << 20;
  const torch::NoGradGuard no_grad;
  torch::Tensor total = torch::zeros({}, long_options);
  for (int64_t begin = 0; begin < flat.numel(); begin += kChunk) {
    const int64_t n = std::min(kChunk, flat.numel() - begin);
    torch::Tensor z = words_all.narrow(0, begin, n).to(torch::kInt64);
    if (size < 8) z.bitwise_and_(mask);
    const int64_t first = as_signed(first_position + static_cast<uint64_t>(begin) + 1);
    z.add_(torch::arange(n, long_options).add_(first).mul_(as_signed(0x9E3779B97F4A7C15ull)));
    if (mix == Mix::kHalves) {
      // lo(x) * hi(x) + x: both halves below 2^32, so the int64 product wraps to the bits of the
      // unsigned one.
      total.add_(z.bitwise_and(as_signed(0xffffffffull)).mul_(shift_right_logical(z, 32)).add_(z).sum(torch::kInt64));
      continue;
    }
    z.bitwise_xor_(shift_right_logical(z, 33)).mul_(as_signed(0xFF51AFD7ED558CCDull));
    z.bitwise_xor_(shift_right_logical(z, 33)).mul_(as_signed(0xC4CEB9FE1A85EC53ull));
    z.bitwise_xor_(shift_right_logical(z, 33));
    total.add_(z.sum(torch::kInt64));
  }
  const int64_t sum = total.item<int64_t>();
  uint64_t out;
  std::memcpy(&out, &sum, sizeof out);
  return out;
}

uint64_t tensor_mixed_sum(const torch::Tensor& t, uint64_t first_position, Mix mix) {
  if (!t.defined() || t.numel() == 0) return 0;
  // The tensor may be a user's (a model file's, a library user's module): a dtype of another width
  // is theirs to change, not a bug.
  const int64_t size = static_cast<int64_t>(t.element_size());
  RETRACE_CHECK(
      size == 1 || size == 2 || size == 4 || size == 8, ConfigError, "a tensor of dtype ", t.scalar_type(), " (", size,
      " bytes an element) cannot be digested by mixed sums (trace.digest_version "
      "3 and 4 read elements of 1, 2, 4 or 8 bytes); convert the model's tensors or use trace.digest_version = 2");
  if (!t.device().is_cpu()) return mixed_sum_on_device(t, first_position, mix);
  const torch::Tensor c = t.contiguous();
  return mixed_sum(c.data_ptr(), c.element_size(), static_cast<uint64_t>(c.numel()), first_position, mix);
}

Digest128 digest_mixed(std::vector<MixedEntry> entries) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  Xxh3 h;
  for (const MixedEntry& e : entries) {
    h.update_u64(e.name.size());
    h.update(e.name);
    if (!e.defined) {
      h.update_u64(kUndefinedTag);
      continue;
    }
    Feed f{h, nullptr};
    header_into(f, e.dtype, e.shape);
    h.update_u64(e.sum);
  }
  return h.digest();
}

Digest128 digest_indices(const std::vector<int64_t>& indices) {
  Xxh3 h;
  for (int64_t i : indices) h.update_u64(static_cast<uint64_t>(i));
  return h.digest();
}

}  // namespace retrace
