// safetensors dtype strings (core/safetensors.h) and torch scalar types, both ways: for checkpoint
// shards and users' tensor data sets.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace retrace::safetensors {

// F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL -> the torch type; nullopt for anything else.
std::optional<c10::ScalarType> torch_type(const std::string& dtype);
// The dtype string of a torch type; nullopt for a type safetensors shards do not hold here.
std::optional<std::string> dtype_of(c10::ScalarType type);

}  // namespace retrace::safetensors
