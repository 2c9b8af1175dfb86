// SPDX-License-Identifier: MIT
// attn/detail/gemm.hpp: the packed, threaded, allocation-free GEMM behind Linear and the
// Q/K/V and output projections.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "attn/config.hpp"
#include "attn/detail/microkernel.hpp"
#include "attn/memory.hpp"
#include "attn/parallel.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Cache blocking of gemm_nt (BLIS's loop order). A column tile of at most kGemmCols is
/// packed depth block by depth block into micro-panels (depth x micro_cols(), contiguous);
/// row blocks of kGemmRows stream past it, and the micro-kernel walks down a row block with
/// one B micro-panel, broadcasting A straight from its rows (A is not packed). Measured
/// with bench/gemm_bench.cpp:
///  - 2-core AVX2 machine (32 KiB L1, 512 KiB L2): contiguous micro-panels beat a strided
///    (depth x tile) panel by 5-12% (its 768-byte row stride left the B micro-panel in 16 of
///    L1's 64 sets), and 768-column tiles beat 192 by about 10%; depth 512 beat 256.
///  - 2-core AVX-512 machine (48 KiB L1, 1 MiB L2, 64-wide micro-panels): depth 512 (a
///    128 KiB micro-panel, read from L2) beat 128 (an L1-sized one) by 5-10%, since C is
///    then read and written once instead of four times for K = 512; broadcasting A from its
///    rows beat packing it into micro-panels by 3-8% (the packing, a strided scalar copy
///    repeated for every column tile, cost more than it saved).
inline constexpr Index kGemmRows = 96;
inline constexpr Index kGemmCols = 768;
template <class Scalar>
constexpr Index gemm_depth() noexcept {
  // At most a 128 KiB B micro-panel (an eighth of L2), 128 to 512 deep.
  return std::clamp<Index>(Index{131072} / (micro_cols<Scalar>() * Index{sizeof(Scalar)}), 128,
                           512);
}

/// Splits `total` into the fewest parts of at most `limit`, of equal size rounded up to a
/// multiple of `multiple` (the last part takes the remainder): equal tiles keep the threads
/// balanced and the depth blocks even.
inline Index even_block(Index total, Index limit, Index multiple) noexcept {
  const Index parts = (total + limit - 1) / limit;
  const Index size = (total + parts - 1) / parts;
  return std::min(limit, (size + multiple - 1) / multiple * multiple);
}

/// Per-thread packing buffer, kept for the thread's lifetime: after the first call no
/// product allocates.
template <class Scalar>
Scalar* gemm_pack_buffer(Index count) {
  thread_local AlignedBuffer<Scalar> buffer;
  buffer.reserve(static_cast<std::size_t>(count));
  return buffer.data();
}

/// Packs B^T for columns [j0, j0 + cols) and depth [p0, p0 + depth) of C = A B^T, where B
/// is (n, k) row-major with leading dimension ldb: out[p * ldo + c] (ldo = cols when
/// omitted). Full square blocks go through an in-register transpose (16 x 16 floats with
/// AVX-512, then 8 x 8); the ragged edges element by element.
template <class Scalar>
inline void pack_transposed(const Scalar* b, Index ldb, Index j0, Index cols, Index p0,
                            Index depth, Scalar* out, Index ldo = 0) noexcept {
  if (ldo <= 0) ldo = cols;
  // Columns [j, j + side) of the output: depth in blocks of side, the rest one by one.
  const auto columns = [&](Index j, Index side, auto transpose) {
    const Scalar* src = b + (j0 + j) * ldb + p0;
    const Index depth_fast = side > 1 ? depth / side * side : 0;
    for (Index p = 0; p < depth_fast; p += side) transpose(src + p, ldb, out + p * ldo + j, ldo);
    for (Index jj = j; jj < j + side; ++jj) {
      const Scalar* row = b + (j0 + jj) * ldb + p0;
      for (Index p = depth_fast; p < depth; ++p) out[p * ldo + jj] = row[p];
    }
  };
  constexpr Index kWide = simd::transpose_width_wide<Scalar>();
  constexpr Index kSide = simd::transpose_width<Scalar>();
  Index j = 0;
  if constexpr (kWide > kSide) {
    for (; j + kWide <= cols; j += kWide) {
      columns(j, kWide, [](const Scalar* s, Index ls, Scalar* d, Index ld) {
        simd::transpose_block_wide(s, ls, d, ld);
      });
    }
  }
  if constexpr (kSide > 1) {
    for (; j + kSide <= cols; j += kSide) {
      columns(j, kSide, [](const Scalar* s, Index ls, Scalar* d, Index ld) {
        simd::transpose_block(s, ls, d, ld);
      });
    }
  }
  for (; j < cols; ++j) {
    const Scalar* row = b + (j0 + j) * ldb + p0;
    for (Index p = 0; p < depth; ++p) out[p * ldo + j] = row[p];
  }
}

/// A B operand of gemm_nt packed once, for a B that does not change between products (a
/// layer's weight): gemm_nt then reads it instead of packing B on every call. Layout: the
/// depth blocks of gemm_nt's blocking for this k, one after another; within a block, B's
/// rows in column groups (micro-panel width, never straddling a segment, counted from each
/// segment's start), each group depth x width contiguous. Any contiguous run of whole
/// segments of it serves a product on those rows of B (see PackedB), with the same result,
/// bit for bit, as packing on the fly.
template <class Scalar>
class PackedGemmB {
 public:
  PackedGemmB() = default;

  /// Packs B (n, k), row-major with leading dimension ldb, for products whose output
  /// segments are `segment` columns wide (0: one segment). Allocates n * k elements.
  PackedGemmB(Index n, Index k, const Scalar* b, Index ldb, Index segment)
      : n_(n), k_(k), segment_(segment > 0 ? segment : std::max<Index>(n, 1)) {
    if (n <= 0 || k <= 0) return;
    data_.reserve(static_cast<std::size_t>(n * k));
    const Index depth_block = even_block(k, gemm_depth<Scalar>(), 8);
    for (Index p0 = 0; p0 < k; p0 += depth_block) {
      const Index depth = std::min(depth_block, k - p0);
      for (Index j = 0, width = 0; j < n; j += width) {
        width = group_width(j);
        pack_transposed(b, ldb, j, width, p0, depth, data_.data() + p0 * n + j * depth, width);
      }
    }
  }

  PackedGemmB(const PackedGemmB& other) : n_(other.n_), k_(other.k_), segment_(other.segment_) {
    if (other.empty()) return;
    data_.reserve(static_cast<std::size_t>(n_ * k_));
    std::copy(other.data_.data(), other.data_.data() + n_ * k_, data_.data());
  }
  PackedGemmB& operator=(const PackedGemmB& other) {
    if (this != &other) *this = PackedGemmB(other);
    return *this;
  }
  PackedGemmB(PackedGemmB&& other) noexcept
      : data_(std::move(other.data_)),
        n_(std::exchange(other.n_, 0)),
        k_(std::exchange(other.k_, 0)),
        segment_(std::exchange(other.segment_, 1)) {}
  PackedGemmB& operator=(PackedGemmB&& other) noexcept {
    data_ = std::move(other.data_);
    n_ = std::exchange(other.n_, 0);
    k_ = std::exchange(other.k_, 0);
    segment_ = std::exchange(other.segment_, 1);
    return *this;
  }
  ~PackedGemmB() = default;

  bool empty() const noexcept { return n_ <= 0 || k_ <= 0; }
  Index rows() const noexcept { return n_; }
  Index depth() const noexcept { return k_; }
  Index segment() const noexcept { return segment_; }

  /// First column of the group holding column j, and that group's width.
  Index group_start(Index j) const noexcept {
    const Index s0 = j - j % segment_;
    return s0 + (j - s0) / micro_cols<Scalar>() * micro_cols<Scalar>();
  }
  Index group_width(Index g) const noexcept {
    return std::min({micro_cols<Scalar>(), segment_ - g % segment_, n_ - g});
  }
  /// The micro-panel of the group starting at column g, in the depth block starting at p0
  /// (depth x group_width(g), row stride group_width(g)).
  const Scalar* panel(Index p0, Index g, Index depth) const noexcept {
    return data_.data() + p0 * n_ + g * depth;
  }

 private:
  AlignedBuffer<Scalar> data_;
  Index n_ = 0, k_ = 0, segment_ = 1;
};

/// The rows [offset, offset + n) of a PackedGemmB, as the B operand of one gemm_nt call
/// (offset a multiple of the pack's segment). An empty PackedB means "pack B per call".
template <class Scalar>
struct PackedB {
  const PackedGemmB<Scalar>* pack = nullptr;
  Index offset = 0;
};

/// Where gemm_nt writes C. Row i = b * rows_per_batch + t and column j = s * segment + e
/// go to data[b * batch_stride + t * ldc + s * segment_stride + e]. The plain row-major
/// layout is one batch and one segment; the head-split layout of the Q/K/V projection,
/// (B, 3H, T, hd), is rows_per_batch = T, segment = hd, segment_stride = T * hd, ldc = hd.
template <class Scalar>
struct GemmOutput {
  Scalar* data = nullptr;
  Index ldc = 0;
  Index rows_per_batch = 0;  // 0: all rows in one batch
  Index batch_stride = 0;
  Index segment = 0;         // 0: all columns in one segment
  Index segment_stride = 0;

  static GemmOutput row_major(Scalar* c, Index ldc) noexcept {
    GemmOutput out;
    out.data = c;
    out.ldc = ldc;
    return out;
  }
  Scalar* row(Index i) const noexcept {
    if (rows_per_batch <= 0) return data + i * ldc;
    return data + (i / rows_per_batch) * batch_stride + (i % rows_per_batch) * ldc;
  }
};

/// C = A (m, k) * B (n, k)^T [+ bias (n) on every row], A and B row-major with the given
/// leading dimensions, C written through `out` (see GemmOutput). This is y = x W^T + b with
/// W in torch.nn.Linear's layout.
///
/// BLIS's loop order: tasks are column tiles of kGemmCols (each packs its B^T panel once
/// per depth block), split by rows only when there are too few to feed the threads; a
/// row block of kGemmRows streams past the panel. Each element of C is computed by one
/// thread in a fixed order, so the result does not depend on the thread count. Does not
/// allocate after the first call on each thread.
template <class Scalar>
void gemm_nt(Index m, Index n, Index k, const Scalar* a, Index lda, const Scalar* b, Index ldb,
             const GemmOutput<Scalar>& out, const Scalar* bias, PackedB<Scalar> prepacked = {}) {
  if (m <= 0 || n <= 0) return;
  const Index segment = out.segment > 0 ? out.segment : n;
  const PackedGemmB<Scalar>* pre =
      prepacked.pack != nullptr && !prepacked.pack->empty() ? prepacked.pack : nullptr;
  ATTN_ASSERT(pre == nullptr || (pre->depth() == k && prepacked.offset + n <= pre->rows() &&
                                 segment % pre->segment() == 0 &&
                                 prepacked.offset % pre->segment() == 0));
  const auto col = [&](Index j) { return (j / segment) * out.segment_stride + j % segment; };
  if (k <= 0) {
    for (Index i = 0; i < m; ++i) {
      for (Index j = 0; j < n; ++j) out.row(i)[col(j)] = bias != nullptr ? bias[j] : Scalar(0);
    }
    return;
  }
  const Index group_cols = micro_cols<Scalar>();
  const Index depth_block = even_block(k, gemm_depth<Scalar>(), 8);
  const Index tile_cols = even_block(n, kGemmCols, group_cols);
  const Index col_tiles = (n + tile_cols - 1) / tile_cols;
  const Index want = 2 * static_cast<Index>(num_threads());
  const Index row_chunks = std::max<Index>(
      1, std::min<Index>((want + col_tiles - 1) / col_tiles, (m + kGemmRows - 1) / kGemmRows));
  const Index chunk_rows =
      ((m + row_chunks - 1) / row_chunks + kMicroRows - 1) / kMicroRows * kMicroRows;
  const Index tasks = col_tiles * row_chunks;
  // Per thread: the packed B^T micro-panels (depth x tile_cols); none with a pre-packed B.
  const Index pack_size = pre != nullptr ? 0 : depth_block * tile_cols;
  const auto run_task = [&](Index task) {
    const Index jt = task % col_tiles, rt = task / col_tiles;
    const Index j0 = jt * tile_cols, cols = std::min(tile_cols, n - j0);
    const Index r0 = rt * chunk_rows, r1 = std::min(m, r0 + chunk_rows);
    Scalar* packed = pre != nullptr ? nullptr : gemm_pack_buffer<Scalar>(pack_size);
    Scalar* crow[kMicroRows];
    for (Index p0 = 0; p0 < k; p0 += depth_block) {
      const Index depth = std::min(depth_block, k - p0);
      const bool first = p0 == 0;
      // The tile's column groups as (column jj, width, micro-panel, its row stride). Groups
      // never straddle a segment, so each is contiguous in C. Packed per call: B^T in
      // micro-panels, one per group (depth x width contiguous), so the micro-kernel reads it
      // sequentially. Pre-packed: the pack's groups, cut at the tile's edges.
      const auto for_each_group = [&](auto&& f) {
        for (Index j = 0; j < cols;) {
          const Index jj = j0 + j;
          if (pre == nullptr) {
            const Index width = std::min({group_cols, cols - j, segment - jj % segment});
            f(jj, width, static_cast<const Scalar*>(packed + j * depth), width);
            j += width;
          } else {
            const Index pcol = prepacked.offset + jj;
            const Index g = pre->group_start(pcol), panel_width = pre->group_width(g);
            const Index width = std::min(panel_width - (pcol - g), cols - j);
            f(jj, width, pre->panel(p0, g, depth) + (pcol - g), panel_width);
            j += width;
          }
        }
      };
      if (pre == nullptr) {
        for_each_group([&](Index jj, Index width, const Scalar*, Index) {
          pack_transposed(b, ldb, jj, width, p0, depth, packed + (jj - j0) * depth, width);
        });
      }
      for (Index i0 = r0; i0 < r1; i0 += kGemmRows) {
        const Index rows = std::min(kGemmRows, r1 - i0);
        for_each_group([&](Index jj, Index width, const Scalar* panel, Index panel_ld) {
          const Index offset = col(jj);
          const Scalar* bias_j = first && bias != nullptr ? bias + jj : nullptr;
          for (Index i = 0; i < rows; i += kMicroRows) {
            const Index group = std::min<Index>(kMicroRows, rows - i);
            for (Index r = 0; r < group; ++r) crow[r] = out.row(i0 + i + r) + offset;
            micro_tile_rows(group, depth, a + (i0 + i) * lda + p0, lda, 1, panel, panel_ld, crow,
                            width, Scalar(1), !first, bias_j);
          }
        });
      }
    }
  };
#if ATTN_HAS_OPENMP
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
  if (threads > 1 && 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                             static_cast<double>(k) > 1e6) {
#pragma omp parallel num_threads(threads)
    {
      // Every thread of the team sizes its buffer now, whether or not the dynamic schedule
      // hands it a task this time: then no later call allocates.
      if (pre == nullptr) gemm_pack_buffer<Scalar>(pack_size);
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < tasks; ++task) run_task(task);
    }
    return;
  }
#endif
  for (Index task = 0; task < tasks; ++task) run_task(task);
}

/// Row-major C (m, n) with leading dimension ldc: C = A B^T [+ bias].
template <class Scalar>
void gemm_nt(Index m, Index n, Index k, const Scalar* a, Index lda, const Scalar* b, Index ldb,
             Scalar* c, Index ldc, const Scalar* bias, PackedB<Scalar> prepacked = {}) {
  gemm_nt(m, n, k, a, lda, b, ldb, GemmOutput<Scalar>::row_major(c, ldc), bias, prepacked);
}

}  // namespace detail
ATTN_NAMESPACE_END
