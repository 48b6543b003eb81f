#include "core/safetensors_torch.h"

#include <utility>

namespace retrace::safetensors {
namespace {
constexpr std::pair<const char*, c10::ScalarType> kTypes[] = {
    {"F64", c10::kDouble}, {"F32", c10::kFloat}, {"F16", c10::kHalf}, {"BF16", c10::kBFloat16}, {"I64", c10::kLong},
    {"I32", c10::kInt},    {"I16", c10::kShort}, {"I8", c10::kChar},  {"U8", c10::kByte},       {"BOOL", c10::kBool},
};
}  // namespace

std::optional<c10::ScalarType> torch_type(const std::string& dtype) {
  for (const auto& [name, type] : kTypes)
    if (dtype == name) return type;
  return std::nullopt;
}

std::optional<std::string> dtype_of(c10::ScalarType type) {
  for (const auto& [name, t] : kTypes)
    if (t == type) return std::string(name);
  return std::nullopt;
}

}  // namespace retrace::safetensors
