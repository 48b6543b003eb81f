// The strict JSON reader (core/strict_json.h) under the checkpoint code's names.
#pragma once

#include "core/strict_json.h"

namespace retrace::ckpt {

using jsonfmt::json_text;
using jsonfmt::json_type_text;
using jsonfmt::parse_strict_json;

}  // namespace retrace::ckpt
