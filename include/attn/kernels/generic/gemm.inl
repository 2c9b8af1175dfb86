// SPDX-License-Identifier: MIT
// attn/kernels/generic/gemm.inl: the packed GEMM's per-set parts: packing B^T into
// micro-panels, one task of a planned GEMM (attn/ops/gemm.hpp plans it and runs the tasks
// on its threads), and filling a PackedGemmB. bfloat16 and float16 operands are widened to
// float while packing (F16C / AVX-512's vcvtph2ps for float16 on the avx2 and avx512 sets,
// integer steps on SSE2, the scalar rule on the scalar set: convert_row()) and run the float
// micro-kernel, except for bfloat16 on the avx512 set's other paths (plan.path):
// the dot product (avx512/bf16_dot.inl's bf16_dot_tile_rows()) and AMX (avx512/amx_bf16.inl's
// amx_panel() and amx_store()), both on pack_pairs()'s k-pairs: the calls to them below are
// dependent (argument types from the template parameters) and compiled for that set only (if
// constexpr on kSetIsa), so the other sets need not declare them.

/// This set's GEMM blocking on this CPU (gemm_blocking(), attn/kernels/gemm_args.hpp).
template <class Scalar>
GemmBlocking gemm_blocking() noexcept {
  return detail::gemm_blocking(micro_cols<Scalar>(), Index{sizeof(Scalar)});
}

/// The deepest depth block (gemm_blocking()'s depth).
template <class Scalar>
Index gemm_depth() noexcept {
  return gemm_blocking<Scalar>().depth;
}

/// Packs B^T for columns [j0, j0 + cols) and depth [p0, p0 + depth) of C = A B^T, where B
/// is (n, k) row-major with leading dimension ldb: out[p * ldo + c] (ldo = cols when
/// omitted). Full square blocks go through an in-register transpose (16 x 16 floats with
/// AVX-512, then the set's narrower one); the ragged edges element by element.
template <class Scalar>
inline void pack_transposed(const Scalar* b, Index ldb, Index j0, Index cols, Index p0, Index depth,
                            Scalar* out, Index ldo = 0) noexcept {
  if (ldo <= 0) ldo = cols;
  // Columns [j, j + side) of the output: depth in blocks of side, the rest one by one.
  const auto columns = [&](Index j, Index side, bool wide) {
    const Scalar* src = b + (j0 + j) * ldb + p0;
    const Index depth_fast = side > 1 ? depth / side * side : 0;
    for (Index p = 0; p < depth_fast; p += side) {
      if (wide) {
        transpose_block_wide(src + p, ldb, out + p * ldo + j, ldo);
      } else {
        transpose_block(src + p, ldb, out + p * ldo + j, ldo);
      }
    }
    for (Index jj = j; jj < j + side; ++jj) {
      const Scalar* row = b + (j0 + jj) * ldb + p0;
      for (Index p = depth_fast; p < depth; ++p) out[p * ldo + jj] = row[p];
    }
  };
  constexpr Index kWide = transpose_width_wide<Scalar>();
  constexpr Index kSide = transpose_width<Scalar>();
  Index j = 0;
  if constexpr (kWide > kSide) {
    for (; j + kWide <= cols; j += kWide) columns(j, kWide, true);
  }
  if constexpr (kSide > 1) {
    for (; j + kSide <= cols; j += kSide) columns(j, kSide, false);
  }
  for (; j < cols; ++j) {
    const Scalar* row = b + (j0 + j) * ldb + p0;
    for (Index p = 0; p < depth; ++p) out[p * ldo + j] = row[p];
  }
}

/// pack_transposed() for a bfloat16 or float16 B, widened to float (exactly) on the way:
/// columns [j0, j0 + cols) with cols <= micro_cols<float>() (one micro-panel). Each run of
/// kStage depth is converted row by row into a stack buffer (16 KiB on AVX-512, in L1) and
/// transposed from there as a float B is.
template <class Operand>
inline void pack_widened(const Operand* b, Index ldb, Index j0, Index cols, Index p0, Index depth,
                         float* out, Index ldo) noexcept {
  constexpr Index kStage = 64;
  float stage[micro_cols<float>() * kStage];
  for (Index d = 0; d < depth; d += kStage) {
    const Index run = std::min(kStage, depth - d);
    for (Index c = 0; c < cols; ++c) {
      convert_row(b + (j0 + c) * ldb + p0 + d, stage + c * kStage, run);
    }
    pack_transposed(stage, kStage, 0, cols, 0, run, out + d * ldo, ldo);
  }
}

/// One micro-panel of op(B) = B^T, B (n, k) row-major: columns [j0, j0 + cols), depth
/// [p0, p0 + depth), row stride ldo, gemm_words(path, depth) rows. Float operands transposed;
/// bfloat16 and float16 ones widened to float, or bfloat16 in k-pairs for the dot product and
/// AMX (avx512 set only; see the file comment), AMX's padded with +0 words to whole tiles
/// and, for whole 16-column tiles (gemm_tiled(); then ldo is cols), stored as 16-column
/// sub-panels one after another.
template <class Operand>
inline void pack_panel(const Operand* b, Index ldb, Index j0, Index cols, Index p0, Index depth,
                       GemmPanel<Operand>* out, Index ldo, Bf16Path path) noexcept {
  if constexpr (is_gemm_storage_v<Operand>) {
    if constexpr (std::is_same_v<Operand, bfloat16> && kSetIsa == Isa::kAvx512) {
      if (path != Bf16Path::kWiden) {
        const Index words = (depth + 1) / 2, rows = gemm_words(path, depth);
        if (gemm_tiled(path, cols)) {
          for (Index t = 0; t < cols; t += 16) {
            GemmPanel<Operand>* sub = out + t * rows;
            pack_pairs(b, ldb, j0 + t, 16, p0, depth, sub, 16);
            std::fill(sub + words * 16, sub + rows * 16, 0.0f);
          }
          return;
        }
        pack_pairs(b, ldb, j0, cols, p0, depth, out, ldo);
        std::fill(out + words * ldo, out + rows * ldo, 0.0f);
        return;
      }
    }
    pack_widened(b, ldb, j0, cols, p0, depth, out, ldo);
  } else {
    pack_transposed(b, ldb, j0, cols, p0, depth, out, ldo);
  }
}

/// Fills `pack` (storage laid out for this set) with B (n, k), row-major with leading
/// dimension ldb.
template <class Operand>
void pack_gemm_b(const Operand* b, Index ldb, PackedGemmB<Operand>& pack) noexcept {
  const Index n = pack.rows(), k = pack.depth(), depth_block = pack.depth_block();
  for (Index p0 = 0; p0 < k; p0 += depth_block) {
    const Index depth = std::min(depth_block, k - p0);
    for (Index j = 0, width = 0; j < n; j += width) {
      width = pack.group_width(j);
      pack_panel(b, ldb, j, width, p0, depth, pack.mutable_panel(p0, j, depth), width, pack.path());
    }
  }
}

/// Packs op(B) for columns [j0, j0 + cols) and depth [p0, p0 + depth) when B is stored
/// (k, n) row-major (C = A B): row copies, out[p * ldo + c].
template <class Scalar>
inline void pack_rows(const Scalar* b, Index ldb, Index j0, Index cols, Index p0, Index depth,
                      Scalar* out, Index ldo) noexcept {
  for (Index p = 0; p < depth; ++p) {
    const Scalar* row = b + (p0 + p) * ldb + j0;
    std::copy(row, row + cols, out + p * ldo);
  }
}

/// dst (cols, rows), leading dimension ldd, = the transpose of src (rows, cols), leading
/// dimension lds, for 16-bit elements (the bfloat16 and float16 backward's GEMM operands, which the
/// GEMM reads as row-major A and B^T only): in 32 x 32 tiles, so each tile's 32 source rows
/// and 32 destination rows (64 bytes each, one line) stay in L1 while it is copied. The
/// avx512 set transposes whole tiles in registers (transpose_block_16bit()); ragged edges,
/// and every tile on the other sets, go element by element. Measured (one thread, CPU time,
/// Emerald Rapids under load, median of 15, bfloat16 4096 x 1536 / 4096 x 512 / 512 x 1536):
/// the register form 5.0-5.9 / 1.3 / 0.40 ms against the element loop's 11-13 / 3.1 / 1.1 ms
/// (the loop in tiles was itself 2-6x faster than untiled, which misses on every write at the
/// large stride); the large ones are then bound by memory (the order of the tiles, by rows,
/// by columns or in 256-row panels, moved them by less than the noise).
template <class T>
void transpose_16bit(Index rows, Index cols, const T* src, Index lds, T* dst, Index ldd) noexcept {
  constexpr Index kTile = 32;
  for (Index r0 = 0; r0 < rows; r0 += kTile) {
    const Index r1 = std::min(rows, r0 + kTile);
    for (Index c0 = 0; c0 < cols; c0 += kTile) {
      const Index c1 = std::min(cols, c0 + kTile);
      if constexpr (kSetIsa == Isa::kAvx512) {
        if (r1 - r0 == kTile && c1 - c0 == kTile) {
          transpose_block_16bit(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
          continue;
        }
      }
      for (Index c = c0; c < c1; ++c) {
        T* to = dst + c * ldd;
        for (Index r = r0; r < r1; ++r) to[r] = src[r * lds + c];
      }
    }
  }
}

/// Copies op(A) rows [i0, i0 + rows) x depth [p0, p0 + depth) of a plan whose A has a
/// general layout (a_pack) into `out`, in the order its memory runs: row-major (rows x
/// depth) for op(A) = A, depth-major (depth x rows) for A^T. Returns the strides (row,
/// depth) to read it with.
template <class Scalar>
inline std::pair<Index, Index> pack_a(const GemmPlan<Scalar>& g, Index i0, Index rows, Index p0,
                                      Index depth, Scalar* out) noexcept {
  const GemmOutput<const Scalar>& a = g.a_layout;
  const Index seg = g.a_segment;
  // Stored row `row`, columns [c0, c0 + n) to `to`, one run per segment.
  const auto copy_run = [&](Index row, Index c0, Index n, Scalar* to) {
    const Scalar* base = a.row(row);
    for (Index c = c0; c < c0 + n;) {
      const Index run = std::min(seg - c % seg, c0 + n - c);
      const Scalar* from = base + a.column(c, seg);
      std::copy(from, from + run, to + (c - c0));
      c += run;
    }
  };
  if (!g.a_transposed) {
    for (Index r = 0; r < rows; ++r) copy_run(i0 + r, p0, depth, out + r * depth);
    return {depth, 1};
  }
  for (Index p = 0; p < depth; ++p) copy_run(p0 + p, i0, rows, out + p * rows);
  return {1, rows};
}

/// AMX: amx_panel() hands the stores of earlier results a share after every this many steps
/// of its tiles (see gemm_task()'s pass 3): small shares fit beside the tiles in flight
/// instead of waiting for them. Measured (one thread, W packed, 4096 x 1536 x 512,
/// 8192 x 1536 x 512 and 2048 x 2304 x 768, fraction of the tile peak in the same run, median
/// of 3 alternating runs, machine loaded): every 4 steps 0.36-0.39 with C rounded to bfloat16,
/// 0.26-0.37 with C float, against 0.19-0.32 and 0.24-0.32 after every 16 (a pair's last).
inline constexpr Index kAmxStoreSteps = 4;

/// AMX, for a C written with non-temporal stores (GemmPlan::stream): the stores' shares after
/// a pair's last step only (a depth block has at most 32 steps: gemm_depth_limit()), instead
/// of every kAmxStoreSteps. Measured (one thread, CPU time, both schedules alternated in one
/// process with the tile peak timed between every run, median of 31 rounds, machine loaded):
/// 1.03x the speed for 4096 x 1536 x 512 with W packed, 1.02x with W packed per call, 1.07x
/// with C rounded to bfloat16, 1.06x for 2048 x 2304 x 768, 1.01x for 4096 x 512 x 512 (the
/// tile loads likely wait behind the non-temporal stores); for a C that stays in the caches
/// (128 x 1536 x 512) every 4 steps stays faster (1.06x). Separate processes (above) had
/// found every 4 faster on the streamed shapes too, within a noise that pairing in one
/// process removes.
inline constexpr Index kAmxStreamSteps = 32;

/// AMX: rows [next, rows) of a group's products (columns [jj, jj + width) of the row block
/// from row i0), waiting in the task's c_buffer to be stored into C (gemm_task()'s pass 3).
struct AmxPending {
  Index jj = 0, width = 0, i0 = 0, rows = 0, next = 0, slot = 0;
};

/// Task `task` of a planned GEMM: column tile task % col_tiles, row chunk task / col_tiles.
/// `packed` is the calling thread's buffer: words(depth_block) * tile_cols elements for op(B)
/// (none with a pre-packed B), then block_rows * depth_block for A when a_pack or when
/// a bfloat16 or float16 A is widened to float or (bfloat16) copied into AMX tiles, then for
/// AMX 2 * block_rows * (micro_cols + 16) floats for two groups' products.
template <class Scalar, class Operand>
void gemm_task(const GemmPlan<Scalar, Operand>& g, Index task, Scalar* packed) noexcept {
  static_assert(std::is_same_v<GemmPanel<Operand>, Scalar>, "float or double panels");
  constexpr bool kWiden = !std::is_same_v<Operand, Scalar>;  // bfloat16 or float16 operands
  // The avx512 set's k-pair paths (dot product, AMX), for bfloat16 only.
  constexpr bool kPairs = std::is_same_v<Operand, bfloat16> && kSetIsa == Isa::kAvx512;
  const Bf16Path path = kPairs ? g.path : Bf16Path::kWiden;
  const bool dot = path == Bf16Path::kDot, amx = path == Bf16Path::kAmx;
  // Panel rows of `depth` elements: k-pairs on the dot-product and AMX paths.
  const auto words = [&](Index depth) { return gemm_words(path, depth); };
  if constexpr (kPairs) {
    if (amx) amx_configure(g);
  }
  const Index jt = task % g.col_tiles, rt = task / g.col_tiles;
  const Index j0 = jt * g.tile_cols, cols = std::min(g.tile_cols, g.n - j0);
  const Index r0 = rt * g.chunk_rows, r1 = std::min(g.m, r0 + g.chunk_rows);
  const Index group_cols = micro_cols<Scalar>(), segment = g.segment;
  const PackedGemmB<Operand>* pre = g.pre;
  Scalar* a_buffer = packed + (pre == nullptr ? words(g.depth_block) * g.tile_cols : 0);
  // AMX: two slots of a group's products (block_rows x c_ld floats each, 16 columns of room
  // for a narrow group's whole tile or a cut group's last one), after A's tiles: one filled by
  // the tiles while the other's waiting results are stored. Measured (one thread, W packed,
  // 4096 x 1536 x 512, 8192 x 1536 x 512 and 2048 x 2304 x 768, fraction of the tile peak in
  // the same run, median of 4 alternating runs, machine loaded): 0.34-0.39 with C rounded,
  // 0.35 with C float, against 0.33 and 0.26-0.34 with a block as wide as the column tile.
  Scalar* c_buffer = amx ? a_buffer + g.block_rows * g.depth_block : nullptr;
  const Index c_ld = group_cols + 16, c_slot = g.block_rows * c_ld;
  Index slot = 0;            // the slot the next group's tiles fill
  Scalar* crow[kMicroRows];  // the micro-tile's rows, as its kernel writes them
  Scalar* c_at[kMicroRows];  // the same rows in C
  alignas(64) Scalar stage[kMicroRows * micro_cols<Scalar>()];  // a micro-tile before rounding
  for (Index p0 = 0; p0 < g.k; p0 += g.depth_block) {
    const Index depth = std::min(g.depth_block, g.k - p0);
    const bool first = p0 == 0, last = p0 + depth >= g.k;
    // AMX: the group whose products wait in c_buffer; stores up to `count` of its rows.
    AmxPending pending;
    const auto store_rows = [&](Index count) {
      if constexpr (kPairs) {
        const Index n = std::min(count, pending.rows - pending.next);
        if (n <= 0) return;
        const Scalar* bias_j = first && g.bias != nullptr ? g.bias + pending.jj : nullptr;
        amx_store(n, c_buffer + pending.slot * c_slot + pending.next * c_ld, c_ld, pending.width,
                  g.out, pending.i0 + pending.next, g.out.column(pending.jj, segment),
                  !first || g.accumulate, bias_j, last ? g.rounded : nullptr, g.stream);
        pending.next += n;
      } else {
        static_cast<void>(count);
      }
    };
    // The tile's column groups as (column jj, width, the group's micro-panel, its width, the
    // first column's offset in it). Groups never straddle a segment, so each is contiguous in
    // C. Packed per call: op(B) in micro-panels, one per group (depth x width contiguous), so
    // the micro-kernel reads it sequentially. Pre-packed: the pack's groups, cut at the tile's
    // edges (then the offset may be past 0).
    const auto for_each_group = [&](auto&& f) {
      for (Index j = 0; j < cols;) {
        const Index jj = j0 + j;
        if (pre == nullptr) {
          const Index width = std::min({group_cols, cols - j, segment - jj % segment});
          f(jj, width, static_cast<const Scalar*>(packed + j * words(depth)), width, Index{0});
          j += width;
        } else {
          const Index pcol = g.pre_offset + jj;
          const Index start = pre->group_start(pcol), panel_width = pre->group_width(start);
          const Index width = std::min(panel_width - (pcol - start), cols - j);
          f(jj, width, pre->panel(p0, start, depth), panel_width, pcol - start);
          j += width;
        }
      }
    };
    if (pre == nullptr) {
      for_each_group([&](Index jj, Index width, const Scalar*, Index, Index) {
        Scalar* to = packed + (jj - j0) * words(depth);
        if constexpr (!kWiden) {
          if (g.b_kn) return pack_rows(g.b, g.ldb, jj, width, p0, depth, to, width);
        }
        pack_panel(g.b, g.ldb, jj, width, p0, depth, to, width, path);
      });
    }
    for (Index i0 = r0; i0 < r1; i0 += g.block_rows) {
      const Index rows = std::min(g.block_rows, r1 - i0);
      // op(A)'s block: broadcast in place (row-major A or A^T) or from its packed copy; a
      // bfloat16 or float16 A widened into the buffer, or read in place by the dot product.
      const Scalar* a_block = nullptr;
      Index ars = 0, acs = 0;
      if constexpr (kPairs) {
        if (amx) {
          // 1. A's rows into whole zero-padded tiles (rows to 32, depth to 32), unless they are
          //    whole tiles already (depth and rows multiples of 32 and 16): then the tiles are
          //    loaded from A itself. Measured (a stand-alone loop of this pass, one core,
          //    4096 x 1536 x 512, median of 10): 0.54 of the tile peak reading A in place, 0.48
          //    copying it first (once per row block and column tile).
          // 2. The products, 32-row blocks past every group (64 columns) of the column tile,
          //    each group's panel serving the row block's 3 blocks in turn, stored as whole
          //    tiles into a slot of c_buffer (rows x the group's columns). Measured (one
          //    core, Emerald Rapids, 4096 x 512 x 512 and 8192 x 1536 x 512, W packed):
          //    1.4-2.5x faster than each 32-row block past all the groups instead.
          // 3. C from c_buffer (amx_store()), each group's rows in shares handed out every
          //    kAmxStoreSteps steps of the next group's tile pairs, or after each pair's last
          //    step for a streamed C (kAmxStreamSteps; the last group's to the next row
          //    block's first), so that the stores run while the tiles compute: the bias, the
          //    previous depth blocks' C, and for gemm_nt_rounded() the rounding into its
          //    bfloat16 C (half the bytes of a float C, which is then neither written nor read
          //    back); non-temporal stores for a large C (run_gemm()). Writing C is what costs:
          //    measured (one thread, W packed, C float, 4096 x 1536 x 512, the in-run tile
          //    peak between runs, one process, median of 15 rounds, machine loaded), 0.32 of
          //    the peak as is, 0.52 without C's stores, and C's stores alone (no tiles) at
          //    1.48 times the peak's rate: interleaved, the two take longer than one after
          //    the other would (1 / 0.32 > 1 / 0.52 + 1 / 1.48). bench/gemm_bench's
          //    BM_AmxTileLoop (this loop on cached operands) is the tiles' own ceiling.
          const bool in_place = depth % 32 == 0 && rows % 16 == 0;
          const bfloat16* tiles = g.a + i0 * g.lda + p0;
          const Index a_ld = in_place ? g.lda : 2 * words(depth);  // amx_pack_a()'s rows
          if (!in_place) {
            auto* copy = reinterpret_cast<bfloat16*>(a_buffer);
            amx_pack_a(tiles, g.lda, rows, depth, copy);
            tiles = copy;
          }
          for_each_group([&](Index jj, Index width, const Scalar* group, Index panel_ld, Index at) {
            // B tiled (gemm_tiled()) and cut where whole tiles do not fit: each 16-column
            // sub-panel's part on its own (amx_panel() writes up to 15 columns past a part
            // narrower than a tile, which the next part or the slot's room past the group
            // takes).
            const bool tiled = gemm_tiled(path, panel_ld);
            const bool pieces = tiled && (at % 16 != 0 || width % 16 != 0);
            // The previous group's rows (in the other slot), in equal shares between this
            // group's tile pairs.
            const Index every = g.stream ? kAmxStreamSteps : kAmxStoreSteps;
            const Index calls = (rows + 31) / 32 * ((std::max<Index>(width, 16) + 31) / 32) *
                                ((words(depth) / 16 + every - 1) / every);
            const Index share = (pending.rows - pending.next + calls - 1) / calls;
            const Index panel_rows = words(depth);
            for (Index i = 0; i < rows; i += 32) {
              const Index n = std::min<Index>(32, rows - i);
              const bfloat16* a_i = tiles + i * a_ld;
              float* c_i = c_buffer + slot * c_slot + i * c_ld;
              const auto between = [&] { store_rows(share); };
              if (!tiled) {
                amx_panel(n, depth, a_i, a_ld, group + at, panel_ld, 1, width, c_i, c_ld, every,
                          between);
              } else if (!pieces) {
                amx_panel(n, depth, a_i, a_ld, group + at * panel_rows, 16, panel_rows, width, c_i,
                          c_ld, every, between);
              } else {
                for (Index s = at; s < at + width; s = s / 16 * 16 + 16) {
                  const Index t = s / 16 * 16, w = std::min(t + 16, at + width) - s;
                  amx_panel(n, depth, a_i, a_ld, group + t * panel_rows + (s - t), 16, 1, w,
                            c_i + (s - at), c_ld, every, between);
                }
              }
            }
            store_rows(pending.rows);
            pending = {jj, width, i0, rows, 0, slot};
            slot ^= 1;
          });
          continue;
        }
      }
      if constexpr (kWiden) {
        if (!dot) {
          for (Index r = 0; r < rows; ++r) {
            convert_row(g.a + (i0 + r) * g.lda + p0, a_buffer + r * depth, depth);
          }
          a_block = a_buffer, ars = depth, acs = 1;
        }
      } else if (g.a_pack) {
        const std::pair<Index, Index> strides = pack_a(g, i0, rows, p0, depth, a_buffer);
        a_block = a_buffer, ars = strides.first, acs = strides.second;
      } else if (g.a_transposed) {
        a_block = g.a + p0 * g.lda + i0, ars = 1, acs = g.lda;
      } else {
        a_block = g.a + i0 * g.lda + p0, ars = g.lda, acs = 1;
      }
      // The micro-tiles. With a rounded C (gemm_nt_rounded()), the last depth block's
      // micro-tiles are rounded into it as they are made: through `stage` (L1) when C holds no
      // earlier sums, so its floats are never written, else through C's rows while they are in
      // L1. Measured (gemm_bench's BM_GemmBf16Rounded, one thread, W packed, Zen 5, 4096 x
      // 1536 x 512, 2048 x 2304 x 768 and 8192 x 1536 x 512, medians of 3 alternated runs):
      // 1.03-2.8x the speed of writing the float C and rounding it in a second pass on the
      // vdpbf16ps path (0.74-0.84 of its peak, from 0.29-0.80), 1.06-2.0x widening.
      const bool round_now = kWiden && last && g.rounded != nullptr;
      const bool staged = round_now && first && !g.accumulate;
      for_each_group([&](Index jj, Index width, const Scalar* group, Index panel_ld, Index at) {
        const Scalar* panel = group + at;
        const Index offset = g.out.column(jj, segment);
        const Scalar* bias_j = first && g.bias != nullptr ? g.bias + jj : nullptr;
        for (Index i = 0; i < rows; i += kMicroRows) {
          const Index group = std::min<Index>(kMicroRows, rows - i);
          for (Index r = 0; r < group; ++r) {
            c_at[r] = g.out.row(i0 + i + r) + offset;
            crow[r] = staged ? stage + r * group_cols : c_at[r];
          }
          bool made = false;
          if constexpr (kPairs) {
            if (dot) {
              bf16_dot_tile_rows(group, depth, g.a + (i0 + i) * g.lda + p0, g.lda, panel, panel_ld,
                                 crow, width, !first || g.accumulate, bias_j);
              made = true;
            }
          }
          if (!made) {
            micro_tile_rows(group, depth, a_block + i * ars, ars, acs, panel, panel_ld, crow, width,
                            Scalar(1), !first || g.accumulate, bias_j);
          }
          if constexpr (kWiden) {
            if (round_now) {
              for (Index r = 0; r < group; ++r) {
                convert_row(static_cast<const Scalar*>(crow[r]), g.rounded + (c_at[r] - g.out.data),
                            width);
              }
            }
          }
        }
      });
    }
    store_rows(pending.rows);  // AMX: the last group's (the next depth block reads C)
  }
  if constexpr (kPairs) {
    if (amx && g.stream) amx_fence(g);
    if (amx) amx_release(g);
  }
}

/// sums[j] += sum over rows i of A(i, j), columns [j0, j1) of an (m, n) matrix in any
/// GemmOutput layout (`segment` its segment width), rows in order: a bias gradient.
template <class Scalar>
void column_sums(Index m, Index j0, Index j1, const GemmOutput<const Scalar>& a, Index segment,
                 Scalar* sums) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  for (Index i = 0; i < m; ++i) {
    const Scalar* base = a.row(i);
    for (Index c = j0; c < j1;) {
      const Index run = std::min(segment - c % segment, j1 - c);
      const Scalar* x = base + a.column(c, segment);
      Scalar* s = sums + c;
      Index e = 0;
      for (; e + W <= run; e += W) V::store(s + e, V::add(V::load(s + e), V::load(x + e)));
      for (; e < run; ++e) s[e] += x[e];
      c += run;
    }
  }
}
