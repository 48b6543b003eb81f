// The model choices a config makes, as enums: parsed once from their config names (config_fields.cpp
// holds the table), so no model compares strings while it trains.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

namespace retrace::model {

// model.activation: the MLP's activation between layers.
enum class Activation : uint8_t { kRelu, kGelu, kTanh };
inline constexpr const char* kActivationNames[] = {"relu", "gelu", "tanh"};

// model.dropout_impl: how CPU dropout masks are drawn (dropout.h).
enum class DropoutImpl : uint8_t { kPhilox, kTorch };
inline constexpr const char* kDropoutImplNames[] = {"philox", "torch"};

// model.gelu_impl: how GELU is computed on CPU float32 tensors (fused.h, gelu_kernel.h).
enum class GeluImpl : uint8_t { kRetrace, kTorch };
inline constexpr const char* kGeluImplNames[] = {"retrace", "torch"};

// model.attention_matmul: how the GPT's attention runs its batched matmuls on CPU float32 tensors
// (fused.h's lanes_bmm, or ATen's bmm).
enum class AttentionMatmul : uint8_t { kLanes, kBlas };
inline constexpr const char* kAttentionMatmulNames[] = {"lanes", "blas"};

// model.checkpoint: the GPT's activation-checkpoint policy (activation_checkpoint.h).
enum class CheckpointPolicy : uint8_t { kNone, kFull, kSqrt, kSelective };
inline constexpr const char* kCheckpointPolicyNames[] = {"none", "full", "sqrt", "selective"};

// The enum value whose name is `s` (names in enum order), or nullopt.
template <typename E, size_t N>
std::optional<E> from_name(const char* const (&names)[N], const char* s) {
  for (size_t i = 0; i < N; ++i)
    if (std::strcmp(names[i], s) == 0) return static_cast<E>(i);
  return std::nullopt;
}

inline const char* option_name(Activation a) { return kActivationNames[static_cast<int>(a)]; }
inline const char* option_name(DropoutImpl d) { return kDropoutImplNames[static_cast<int>(d)]; }
inline const char* option_name(GeluImpl g) { return kGeluImplNames[static_cast<int>(g)]; }
inline const char* option_name(AttentionMatmul m) { return kAttentionMatmulNames[static_cast<int>(m)]; }
inline const char* option_name(CheckpointPolicy p) { return kCheckpointPolicyNames[static_cast<int>(p)]; }

}  // namespace retrace::model
