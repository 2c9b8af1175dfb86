// SPDX-License-Identifier: MIT
// attn/kernels/avx512/amx_bf16.inl: the avx512 set's GEMM kernel for bfloat16 operands on AMX:
// tdpbf16ps multiplies a 16-row x 32-deep bfloat16 tile of A by a 16-pair x 16-column tile of
// B (k-pairs) into a 16 x 16 float tile of C, 16384 products per instruction (bench/fma_peak.cpp
// measures the rate). Included by attn/kernels/avx512.hpp inside namespace
// attn::kernels::avx512, in a target region that adds AMX-TILE and AMX-BF16 (after vec.inl);
// generic/gemm.inl calls it when the plan's path is kAmx, which detail::amx_support() allows
// only once the operating system has granted the tile state.
//
// Tiles (one configuration per task, amx_configure(), released by amx_release()): tmm0-3 hold
// a 32 x 32 block of C (2 x 2 tiles), tmm4-5 two 16-row A tiles, tmm6-7 two B tiles; every
// tile has 16 rows of 64 bytes, so depth runs in whole steps of 32. B is the dot path's k-pair
// micro-panel (pack_pairs()), its pairs run on to a multiple of 16 with +0 words
// (gemm_words()); a tile of it is 16 pair-rows at column c, row stride the panel's width, or in
// the GEMM, for panels of whole tiles, one contiguous KiB of 16-column sub-panels
// (gemm_tiled()). A is copied per row block into whole tiles (amx_pack_a(): rows to a multiple
// of 32, depth to a multiple of 32, padded with +0), so no tile reads past A or meets its
// memory beyond depth; the GEMM reads a row block that is whole tiles from A itself.
// Panels at least 16 wide end with a tile that overlaps the one before it (each element of C
// depends only on its row of A and column of B, so the overlap computes the same bits);
// narrower ones are copied into a 16-wide +0-padded panel first.
// The GEMM (generic/gemm.inl) runs amx_panel(), which stores the tiles whole into a per-thread
// block of a row block's products, then amx_store(), which writes C from it once per row
// block (bias, previous depth blocks, optional rounding to bfloat16, non-temporal stores);
// the attention kernels run amx_block() and amx_tiles().
//
// Numerics: tests/kernels/bf16_gemm_test.cpp and docs/precision.md (measured, not the SDM's
// pseudocode). MXCSR is neither read nor written.

/// The tile configuration of every AMX product: palette 1, tmm0-7 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

/// Loads the tile configuration (zeroing the tiles) on the calling thread, for one task of
/// `plan` (a template, so that generic/gemm.inl's call is dependent: see there).
template <class Plan>
inline void amx_configure(const Plan&) noexcept {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the configuration, which
  // lets it drop the stores above: a barrier keeps them.
  __asm__ volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

/// Releases the tiles: the thread's AMX state returns to its initial (not saved on context
/// switches) state.
template <class Plan>
inline void amx_release(const Plan&) noexcept {
  _tile_release();
}

/// Depth rounded up to whole tiles.
constexpr Index amx_depth(Index depth) noexcept { return (depth + 31) / 32 * 32; }

/// Rows [0, rows) and depth [0, depth) of a bfloat16 A (row-major, leading dimension lda) into
/// out (amx_depth(depth) per row, rows rounded up to a multiple of 32), +0 elsewhere.
inline void amx_pack_a(const bfloat16* a, Index lda, Index rows, Index depth,
                       bfloat16* out) noexcept {
  const Index width = amx_depth(depth), padded = (rows + 31) / 32 * 32;
  for (Index r = 0; r < padded; ++r) {
    bfloat16* to = out + r * width;
    Index p = 0;
    if (r < rows) {
      std::memcpy(static_cast<void*>(to), a + r * lda, static_cast<std::size_t>(depth) * 2);
      p = depth;
    }
    for (; p < width; ++p) to[p] = bfloat16::from_bits(0);
  }
}

/// Lanes [lo, 16) of a 16-lane mask.
inline __mmask16 amx_lanes_from(Index lo) noexcept {
  return static_cast<__mmask16>(0xffffu << static_cast<unsigned>(lo));
}

/// C rows [row0, row0 + rows) (rows <= 32), columns [col, col + cols) of `out` (col its offset
/// within a row): (accumulate ? C : 0) + (sum_p A[r, p] B[p, c] + bias[c]) (bias +0 when
/// null). `a` is amx_pack_a()'s block (row stride amx_depth(depth)); `b` a k-pair micro-panel
/// of `cols` columns, row stride ldb words, gemm_words(kAmx, depth) rows. Tiles configured.
inline void amx_block(Index rows, Index depth, const bfloat16* a, const float* b, Index ldb,
                      Index cols, const GemmOutput<float>& out, Index row0, Index col,
                      bool accumulate, const float* bias) noexcept {
  const Index steps = amx_depth(depth) / 32, a_stride = amx_depth(depth) * 2;
  alignas(64) float narrow[256 * 16];  // a panel narrower than a tile, widened to 16 columns
  if (cols < 16) {
    for (Index q = 0; q < steps * 16; ++q) {
      for (Index c = 0; c < 16; ++c) narrow[q * 16 + c] = c < cols ? b[q * ldb + c] : 0.0f;
    }
    b = narrow, ldb = 16;
  }
  const Index b_stride = ldb * 4;
  const bool two = rows > 16;
  // Tile columns: every 16 from 0, then one ending at the panel's edge.
  Index starts[8], count = 0;
  const Index width = cols < 16 ? 16 : cols;
  for (Index s = 0; s + 16 <= width; s += 16) starts[count++] = s;
  if (width % 16 != 0) starts[count++] = width - 16;
  alignas(64) float c_tiles[32 * 32];
  for (Index t = 0; t < count; t += 2) {
    const Index s0 = starts[t], s1 = starts[t + 1 < count ? t + 1 : t];
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (Index step = 0; step < steps; ++step) {
      const float* bp = b + step * 16 * ldb;
      _tile_loadd(4, a + step * 32, a_stride);
      _tile_loadd(6, bp + s0, b_stride);
      _tile_loadd(7, bp + s1, b_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, a + 16 * (a_stride / 2) + step * 32, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, c_tiles, 128);
    _tile_stored(1, c_tiles + 16, 128);
    if (two) {
      _tile_stored(2, c_tiles + 16 * 32, 128);
      _tile_stored(3, c_tiles + 16 * 32 + 16, 128);
    }
    // Store: each tile's columns not written by the tile before it (the last may overlap),
    // within the panel's `cols`; the bias and/or the previous C added as the other paths do.
    for (int h = 0; h < 2 && (h == 0 || t + 1 < count); ++h) {
      const Index s = h == 0 ? s0 : s1;
      const Index index = t + h;
      const Index lo = index == 0 ? 0 : std::max<Index>(0, starts[index - 1] + 16 - s);
      const Index hi = std::min<Index>(16, cols - s);
      if (hi <= lo) continue;
      const __mmask16 mask = amx_lanes_from(lo) & static_cast<__mmask16>((1u << hi) - 1u);
      const __m512 bias_v =
          bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + s) : _mm512_setzero_ps();
      for (Index r = 0; r < rows; ++r) {
        float* cp = out.row(row0 + r) + col + s;
        __m512 v = _mm512_add_ps(_mm512_load_ps(c_tiles + r * 32 + h * 16), bias_v);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, cp));
        _mm512_mask_storeu_ps(cp, mask, v);
      }
    }
  }
}

/// The GEMM's products of a row block (generic/gemm.inl): rows [0, rows) (rows <= 32) x
/// columns [0, cols) of A B, stored as whole tiles into `c` (row stride ldc floats): 16 or 32
/// rows, and 16 columns for a panel narrower than a tile (c has room for them). `a`: rows of
/// whole 32-deep tiles, row stride lda elements (amx_pack_a()'s block, lda amx_depth(depth), or
/// A itself when depth is whole tiles and rows are whole tiles); `b` a k-pair micro-panel,
/// gemm_words(kAmx, depth) rows of stride ldb words, whose tile for columns [s, s + 16) starts
/// at b + s * col_step: col_step 1 for one panel (ldb its width), gemm_words(kAmx, depth) for
/// 16-column sub-panels one after another (ldb 16, cols whole tiles: gemm_tiled()). No masks and
/// no staging: amx_store() later adds the bias and writes C. `between()` is called for each pair
/// of tile columns after every `every` steps of 32 depth (and after the last), once their
/// products are issued: the caller's stores of earlier results (amx_store()) then run while the
/// tiles compute (ceil(steps / every) calls per pair).
template <class Between>
inline void amx_panel(Index rows, Index depth, const bfloat16* a, Index lda, const float* b,
                      Index ldb, Index col_step, Index cols, float* c, Index ldc, Index every,
                      Between&& between) {
  const Index steps = amx_depth(depth) / 32, a_stride = lda * 2;
  // A panel narrower than a tile, widened to 16 columns (depth blocks are at most 1024 deep:
  // gemm_depth_limit()).
  alignas(64) float narrow[512 * 16];
  if (cols < 16) {
    for (Index q = 0; q < steps * 16; ++q) {
      for (Index col = 0; col < 16; ++col)
        narrow[q * 16 + col] = col < cols ? b[q * ldb + col] : 0.0f;
    }
    b = narrow, ldb = 16, col_step = 1;
  }
  const Index b_stride = ldb * 4, c_stride = ldc * 4, b_step = 16 * ldb;
  const bool two = rows > 16;
  const bfloat16* a1 = a + 16 * lda;
  const Index width = cols < 16 ? 16 : cols;
  // Tile columns in pairs: every 16 from 0, the last pair's second tile ending at the panel's
  // edge (overlapping, with the same bits, the one before it).
  for (Index s0 = 0; s0 < width; s0 += 32) {
    const bool pair = s0 + 16 < width;
    const Index s1 = pair ? std::min<Index>(s0 + 16, width - 16) : s0;
    const float* b0 = b + s0 * col_step;
    const float* b1 = b + s1 * col_step;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (Index step = 0; step < steps; ++step) {
      _tile_loadd(4, a + step * 32, a_stride);
      _tile_loadd(6, b0 + step * b_step, b_stride);
      _tile_dpbf16ps(0, 4, 6);
      if (pair) {
        _tile_loadd(7, b1 + step * b_step, b_stride);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (two) {
        _tile_loadd(5, a1 + step * 32, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        if (pair) _tile_dpbf16ps(3, 5, 7);
      }
      if ((step + 1) % every == 0 || step + 1 == steps) between();
    }
    _tile_stored(0, c + s0, c_stride);
    if (pair) _tile_stored(1, c + s1, c_stride);
    if (two) {
      _tile_stored(2, c + 16 * ldc + s0, c_stride);
      if (pair) _tile_stored(3, c + 16 * ldc + s1, c_stride);
    }
  }
}

/// 32 floats (two vectors) -> 32 bfloat16, rounded as convert_ops::bfloat16_lanes() rounds
/// them (nearest even, NaN -> 0x7FC0), lo's 16 first: one 64-byte vector for one
/// non-temporal store instead of two 32-byte ones (measured on this Emerald Rapids VM, one
/// core, 12 MiB: 0.64 ms against 0.95 ms).
inline __m512i amx_bfloat16_high(__m512i u) noexcept {  // the bfloat16 in each high half
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC00000));
}
inline __m512i amx_bfloat16_pair(__m512 lo, __m512 hi) noexcept {
  // The high halves of lo's lanes, then of hi's.
  const __m512i odd =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(amx_bfloat16_high(_mm512_castps_si512(lo)), odd,
                                   amx_bfloat16_high(_mm512_castps_si512(hi)));
}

/// amx_store()'s sum for columns [s, s + 16) of a row (`mask` of them): from + bias (+ cp).
inline __m512 amx_sum(const float* from, const float* cp, const float* bias, Index s,
                      __mmask16 mask, bool accumulate) noexcept {
  const __m512 bias_v =
      bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + s) : _mm512_setzero_ps();
  __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, from + s), bias_v);
  if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, cp + s));
  return v;
}

/// C rows [row0, row0 + rows), columns [col, col + cols) of `out` (col its offset within a
/// row) from amx_panel()'s results `c` (row stride ldc): (accumulate ? C : 0) + (c + bias)
/// (bias +0 when null), the additions amx_block() makes. With `rounded` (a bfloat16 twin of
/// out's memory: the same offsets from its start), each sum is rounded to nearest even into
/// it instead, with the bits of convert_row() (convert.inl), and `out` is not written.
/// `stream`: whole aligned vectors go to memory with non-temporal stores (no read for
/// ownership; see run_gemm() for when); amx_fence() orders them before later stores.
inline void amx_store(Index rows, const float* c, Index ldc, Index cols,
                      const GemmOutput<float>& out, Index row0, Index col, bool accumulate,
                      const float* bias, bfloat16* rounded, bool stream) noexcept {
  for (Index r = 0; r < rows; ++r) {
    float* cp = out.row(row0 + r) + col;
    bfloat16* rp = rounded != nullptr ? rounded + (cp - out.data) : nullptr;
    const float* from = c + r * ldc;
    for (Index s = 0; s < cols;) {
      if (rp != nullptr && stream && s + 32 <= cols &&
          reinterpret_cast<std::uintptr_t>(rp + s) % 64 == 0) {
        const __m512i pair = amx_bfloat16_pair(amx_sum(from, cp, bias, s, 0xffff, accumulate),
                                               amx_sum(from, cp, bias, s + 16, 0xffff, accumulate));
        _mm512_stream_si512(reinterpret_cast<__m512i*>(rp + s), pair);
        s += 32;
        continue;
      }
      const __mmask16 mask = convert_ops::first_lanes(cols - s);
      const __m512 v = amx_sum(from, cp, bias, s, mask, accumulate);
      if (rp != nullptr) {
        const __m256i r16 =
            _mm512_cvtepi32_epi16(convert_ops::bfloat16_lanes(_mm512_castps_si512(v)));
        if (stream && mask == 0xffff && reinterpret_cast<std::uintptr_t>(rp + s) % 32 == 0) {
          _mm256_stream_si256(reinterpret_cast<__m256i*>(rp + s), r16);
        } else {
          _mm256_mask_storeu_epi16(rp + s, mask, r16);
        }
      } else if (stream && mask == 0xffff && reinterpret_cast<std::uintptr_t>(cp + s) % 64 == 0) {
        _mm512_stream_ps(cp + s, v);
      } else {
        _mm512_mask_storeu_ps(cp + s, mask, v);
      }
      s += 16;
    }
  }
}

/// Orders amx_store()'s non-temporal stores before every later store (a task's end).
template <class Plan>
inline void amx_fence(const Plan&) noexcept {
  _mm_sfence();
}

/// amx_tiles()'s block of C tiles (i, j) .. (i + 1, j + 1) (those below row_tiles and
/// col_tiles).
inline void amx_tile_block(Index i, Index j, Index row_tiles, Index col_tiles, Index steps,
                           const bfloat16* a, Index lda, const float* b, Index ldb, float* c,
                           Index ldc, bool accumulate) noexcept {
  const Index a_bytes = lda * 2, b_bytes = ldb * 4, c_bytes = ldc * 4;
  const bool two_rows = i + 1 < row_tiles, two_cols = j + 1 < col_tiles;
  const bfloat16* a0 = a + i * 16 * lda;
  const bfloat16* a1 = a0 + 16 * lda;
  float* c00 = c + i * 16 * ldc + j * 16;
  float* c10 = c00 + 16 * ldc;
  if (accumulate) {
    _tile_loadd(0, c00, c_bytes);
    if (two_cols) _tile_loadd(1, c00 + 16, c_bytes);
    if (two_rows) _tile_loadd(2, c10, c_bytes);
    if (two_rows && two_cols) _tile_loadd(3, c10 + 16, c_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (Index s = 0; s < steps; ++s) {
    const float* bp = b + s * 16 * ldb + j * 16;
    _tile_loadd(4, a0 + s * 32, a_bytes);
    _tile_loadd(6, bp, b_bytes);
    _tile_dpbf16ps(0, 4, 6);
    if (two_cols) {
      _tile_loadd(7, bp + 16, b_bytes);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_rows) {
      _tile_loadd(5, a1 + s * 32, a_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if (two_cols) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c00, c_bytes);
  if (two_cols) _tile_stored(1, c00 + 16, c_bytes);
  if (two_rows) _tile_stored(2, c10, c_bytes);
  if (two_rows && two_cols) _tile_stored(3, c10 + 16, c_bytes);
}

/// C (16 row_tiles x 16 col_tiles floats, row stride ldc) (+)= A B on whole tiles, for the
/// attention's products, whose operands and outputs live in scratch sized for whole tiles:
/// A bfloat16 (row stride lda elements, 32 steps deep), B k-pair words (row stride ldb, 16
/// per step). Blocks of 2 x 2 C tiles (tmm0-3) over A tiles tmm4-5 and B tiles tmm6-7 (the
/// configuration amx_configure() loads); C is loaded into the tiles to accumulate and stored
/// from them, with no copy. Measured (perf, one core, B 1, H 16, T 1024, d 128, with K read
/// in place): the attention call 1.6x faster than on amx_block() (58 -> 36 ms CPU), its
/// products 1.4x (20 -> 14 ms); amx_block()'s staging copy and masked stores serve any edge.
inline void amx_tiles(Index row_tiles, Index col_tiles, Index steps, const bfloat16* a, Index lda,
                      const float* b, Index ldb, float* c, Index ldc, bool accumulate) noexcept {
  for (Index i = 0; i < row_tiles; i += 2) {
    for (Index j = 0; j < col_tiles; j += 2) {
      amx_tile_block(i, j, row_tiles, col_tiles, steps, a, lda, b, ldb, c, ldc, accumulate);
    }
  }
}

/// amx_tiles()'s products as a job issued a block of 2 x 2 C tiles at a time (step()), in
/// amx_tiles()'s order and with its bits, so that vector work can run between the blocks: a
/// tile instruction occupies the reorder buffer until its tiles are done, so the vector
/// instructions behind one block of products (128-256 cycles of tdpbf16ps) overlap with it,
/// those behind a whole tile's products mostly wait.
struct AmxTileJob {
  Index row_tiles = 0, col_tiles = 0, steps = 0;
  const bfloat16* a = nullptr;
  Index lda = 0;
  const float* b = nullptr;
  Index ldb = 0;
  float* c = nullptr;
  Index ldc = 0;
  bool accumulate = false;
  Index next = 0;  ///< the next block, row-major over the (row_tiles / 2, col_tiles / 2) blocks

  bool done() const noexcept { return next >= (row_tiles + 1) / 2 * ((col_tiles + 1) / 2); }
  /// Issues the next block (tiles configured; not done()).
  void step() noexcept {
    const Index across = (col_tiles + 1) / 2;
    const Index i = next / across * 2, j = next % across * 2;
    ++next;
    amx_tile_block(i, j, row_tiles, col_tiles, steps, a, lda, b, ldb, c, ldc, accumulate);
  }
};

/// Up to two AmxTileJobs run in the order they were pushed, a block per step().
struct AmxTileQueue {
  AmxTileJob jobs[2];
  int first = 0, count = 0;

  /// Queues amx_tiles() with these arguments (at most two jobs unfinished).
  void push(Index row_tiles, Index col_tiles, Index steps, const bfloat16* a, Index lda,
            const float* b, Index ldb, float* c, Index ldc, bool accumulate) noexcept {
    if (first == count) first = count = 0;
    jobs[count++] = {row_tiles, col_tiles, steps, a, lda, b, ldb, c, ldc, accumulate, 0};
  }
  /// Issues the next block of the first unfinished job, if any.
  void step() noexcept {
    while (first < count && jobs[first].done()) ++first;
    if (first < count) jobs[first].step();
  }
  /// Issues every block left.
  void drain() noexcept {
    for (; first < count; ++first) {
      while (!jobs[first].done()) jobs[first].step();
    }
  }
};

/// An empty AmxTileQueue for one attention task (a template, so that the generic kernel's
/// call is dependent, as amx_configure()'s).
template <class Task>
inline AmxTileQueue amx_tile_queue(const Task&) noexcept {
  return {};
}
