// A checkpoint shard is a safetensors file (core/safetensors.h holds the byte layout, the writer
// and the validating reader); this header gives the checkpoint code its names for them.
#pragma once

#include "core/safetensors.h"

namespace retrace::ckpt {

using safetensors::dtype_size;
using safetensors::kMaxShardHeaderBytes;
using safetensors::kMaxTensorRank;
using safetensors::parse_shard;
using safetensors::parse_shard_header;
using safetensors::read_shard;
using safetensors::read_shard_header;
using safetensors::ShardData;
using safetensors::ShardFileInfo;
using safetensors::TensorEntry;
using safetensors::TensorView;
using safetensors::write_shard;
using safetensors::WriteFaults;

}  // namespace retrace::ckpt
