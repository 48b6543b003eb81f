#include "model/chunk_layout.h"

#include <ATen/ATen.h>

#include <utility>

#include "core/error.h"

namespace retrace::model {
namespace {
thread_local const ChunkLayout* current = nullptr;
}  // namespace

const ChunkLayout* chunk_layout() { return current; }

ChunkScope::ChunkScope(ChunkLayout layout) : layout_(std::move(layout)), outer_(current) {
  RETRACE_CHECK(layout_.chunk > 0 && layout_.samples > 0 && layout_.samples % layout_.chunk == 0 &&
                    static_cast<int64_t>(layout_.generators.size()) == layout_.chunks(),
                InvariantError, "ChunkScope: ", layout_.samples, " samples in chunks of ", layout_.chunk, " with ",
                layout_.generators.size(), " generators");
  current = &layout_;
}

ChunkScope::~ChunkScope() { current = outer_; }

int64_t rows_per_chunk(int64_t rows, int64_t chunks) {
  RETRACE_CHECK(chunks > 0 && rows % chunks == 0, InvariantError, "batch invariance: ", rows,
                " rows do not split into ", chunks, " chunks of whole samples");
  return rows / chunks;
}

ChunkSink chunk_sink(const at::Tensor& param) {
  if (param.grad().defined()) {
    RETRACE_CHECK(param.grad().is_contiguous() && param.grad().sizes() == param.sizes(), InvariantError,
                  "batch invariance: a parameter's gradient of ", param.grad().sizes(),
                  " is not a contiguous tensor of its shape ", param.sizes());
    return {param.grad(), true};
  }
  return {at::empty(param.sizes(), param.options().requires_grad(false)), false};
}

}  // namespace retrace::model
