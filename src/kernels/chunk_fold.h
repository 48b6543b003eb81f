// Batch invariance's weight gradient in one pass (model/chunk_layout.h, model/owned_linear.cpp).
// Torch-free.
//
// A linear layer's weight gradient under runtime.invariance = "batch" is a fold over chunks of
// rows: C = ((P0 + P1) + P2) + ..., P_c = A_c^T B_c the chunk's own product. One accumulating BLIS
// call per chunk gives those bits but reads and writes all of C once per chunk: for the MLP's first
// layer, 16 passes over 401k floats per step. This kernel keeps a tile of C in registers across the
// chunks, so C is read and written once.
//
// Bits: element (i, j) of P_c is one fused multiply-add chain from +0 over the chunk's rows in
// order, s = fma(a[p][i], b[p][j], s), which is what BLIS's haswell micro-kernel computes within
// one k panel (kc = 256 for float; so chunks of at most kFoldChunkRowsMax rows); C then adds each
// P_c rounded once, as BLIS's beta = 1 update does. Invariance.OnePieceGivesThePiecewiseBitsOnTheMlp
// holds it against the BLIS path, bit for bit.
#pragma once

#include <cstdint>

namespace retrace::kernels {

inline constexpr int64_t kFoldChunkRowsMax = 256;
// Rows of C per register tile: a tile of C's rows [i0, i1) should start at a multiple of this.
inline constexpr int64_t kFoldTileRows = 6;

// Whether this CPU runs the kernel (AVX2 and FMA); where not, callers keep the BLIS path.
bool chunk_fold_supported();

// B [m, k] (row-major) packed once per call for every tile: panels of kFoldTileCols columns, panel q
// holding B[p][q * 16 + col] at packed[(q * m + p) * 16 + col], zeros past column k.
inline constexpr int64_t kFoldTileCols = 16;
int64_t packed_b_panels(int64_t k);
int64_t packed_b_floats(int64_t m, int64_t k);
// Panels [q0, q1) of the packing (panels may be packed concurrently).
void pack_b(int64_t m, int64_t k, const float* b, float* packed, int64_t q0, int64_t q1);

// Rows [i0, i1) of C [n, k] (row-major, leading dimension k), for A [m, n] (row-major) and B
// packed by pack_b, cut into chunks of r rows (m a multiple of r, 1 <= r <= kFoldChunkRowsMax):
// C[i][j] = (fresh ? P0 : C + P0) + P1 + ... with P_c[i][j] = sum over the chunk's rows p of
// A[p][i] * B[p][j] as above. Tiles of rows may run concurrently.
void fold_chunk_products(int64_t i0, int64_t i1, int64_t m, int64_t n, int64_t k, int64_t r, const float* a,
                         const float* packed_b, float* c, bool fresh);

}  // namespace retrace::kernels
