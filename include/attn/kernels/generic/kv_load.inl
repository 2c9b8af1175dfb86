// SPDX-License-Identifier: MIT
// attn/kernels/generic/kv_load.inl: the one dequantising loader of stored key/value rows (a
// quantised KVCache, attn/kernels/kv_storage.hpp), written once for every set: a set's
// <set>/convert.inl may provide widen_int8_part() and widen_int4_blocks() for float (and
// convert_vector_part() for the float formats); the scalar loops here do the rest and give
// the same values (each element is q times its scale, one rounding).

/// No vector form in this set: nothing done (false).
template <class Scalar>
inline Index widen_int8_part(const std::int8_t*, Scalar*, Index, float) noexcept {
  return 0;
}
template <class Scalar>
inline bool widen_int4_block(const unsigned char*, Scalar*, float) noexcept {
  return false;
}

/// Calls fn(row, scales, j, run) for each run of rows slot + j .. slot + j + run - 1 of item b,
/// key/value head h of `s` that follow each other at row_stride (to the end of the n rows;
/// paged: to the end of a block, or of the blocks after it that follow it in the pool, as a
/// sequence appended into free blocks gets them): one address lookup and one call of fn per
/// run (each call of the score kernels sets its query registers up again; a pool's blocks
/// taken in order give a tile one run, as a contiguous cache's).
template <class Fn>
void stored_runs(const StoredRows& s, Index b, Index h, Index slot, Index n, Fn&& fn) {
  if (s.table == nullptr) {
    if (n > 0) fn(s.row(b, h, slot), s.scales_of(b, h, slot), Index(0), n);
    return;
  }
  const Index* table = s.table + b * s.table_stride;
  // Rows continue into the next block when it lies right after this one (its keys, and its
  // scales, at the next row stride): a property of the layout, not of the block.
  const bool joinable =
      s.item_stride == s.block_rows * s.row_stride &&
      (s.scales == nullptr || s.scale_item_stride == s.block_rows * s.scale_row_stride);
  for (Index j = 0; j < n;) {
    Index at = (slot + j) / s.block_rows;
    Index run = std::min(n - j, s.block_rows - (slot + j) % s.block_rows);
    while (joinable && j + run < n && table[at + 1] == table[at] + 1) {
      run = std::min(n - j, run + s.block_rows), ++at;
    }
    fn(s.row(b, h, slot + j), s.scales_of(b, h, slot + j), j, run);
    j += run;
  }
}

/// Rows slot .. slot + n - 1 of item b, key/value head h of `s` (no ring wrap inside; paged
/// rows may cross blocks), each `width` elements, dequantised into out (n, width) (row
/// stride width): q times its scale, one rounding (the int8 and int4 levels are exact in
/// Scalar); Scalar rows copied. Asks for the rows ahead (keys_ahead()) and for the same rows of
/// `values` (width dv; null: none) as it goes (key_prefetch(), as the int8 score passes ask:
/// without, a decode step's attention over a bfloat16 cache waited on these loads, 1.3x the
/// time at B 1 L 8192 on Zen 5).
template <class Scalar>
void load_stored_rows(const StoredRows& s, Index b, Index h, Index slot, Index n, Index width,
                      Scalar* out, const StoredRows* values = nullptr, Index dv = 0) noexcept {
  constexpr Index half = kInt4Block / 2;
  const auto load = [&](const unsigned char* row, const float* scales, Scalar* o) {
    switch (s.element) {
      case KVElement::kBFloat16:
        convert_row(reinterpret_cast<const bfloat16*>(row), o, width);
        break;
      case KVElement::kFloat16:
        convert_row(reinterpret_cast<const float16*>(row), o, width);
        break;
      case KVElement::kFloat8E4M3:
        convert_row(reinterpret_cast<const float8_e4m3*>(row), o, width);
        break;
      case KVElement::kFloat8E5M2:
        convert_row(reinterpret_cast<const float8_e5m2*>(row), o, width);
        break;
      case KVElement::kInt8: {  // one scale per row
        const auto* q = reinterpret_cast<const std::int8_t*>(row);
        const float scale = scales[0];
        for (Index e = widen_int8_part(q, o, width, scale); e < width; ++e) {
          o[e] = static_cast<Scalar>(static_cast<float>(q[e]) * scale);
        }
        return;
      }
      case KVElement::kInt4: {  // a block's elements share a scale when group % 32 == 0
        for (Index e0 = 0; e0 < width; e0 += kInt4Block) {
          const unsigned char* block = row + e0 / kInt4Block * half;
          const Index count = std::min(kInt4Block, width - e0);
          if (count == kInt4Block && s.group % kInt4Block == 0 &&
              widen_int4_block(block, o + e0, scales[e0 / s.group])) {
            continue;
          }
          for (Index i = 0; i < count; ++i) {
            const unsigned nibble = i < half ? block[i] & 0x0Fu : block[i - half] >> 4;
            o[e0 + i] = static_cast<Scalar>(static_cast<float>(static_cast<int>(nibble) - 8) *
                                            scales[(e0 + i) / s.group]);
          }
        }
        return;
      }
      case KVElement::kScalar:  // paged Scalar rows: copied as they are
        std::memcpy(o, row, static_cast<std::size_t>(width) * sizeof(Scalar));
        return;
    }
    if (scales == nullptr) return;
    for (Index e0 = 0, g = 0; e0 < width; e0 += s.group, ++g) {
      scale_row(o + e0, std::min(s.group, width - e0), static_cast<Scalar>(scales[g]));
    }
  };
  stored_runs(
      s, b, h, slot, n, [&](const unsigned char* row, const float* scales, Index j0, Index run) {
        const KeyRequests requests(
            key_prefetch(s, values, b, h, slot + j0, run, n - j0, width, dv, Index(sizeof(Scalar))),
            row, s.row_stride);
        for (Index r = 0; r < run; ++r) {
          requests(r);
          load(row + r * s.row_stride,
               scales != nullptr ? scales + r * s.scale_row_stride : nullptr,
               out + (j0 + r) * width);
        }
      });
}

/// Asks for rows slot .. slot + n - 1 of item b, key/value head h of a paged `s` (stored rows
/// of `width` elements, not kScalar: their bytes and their scales) through the block table,
/// when those rows' blocks and the one before them are not one run of neighbouring blocks;
/// otherwise nothing.
/// In a run, the score pass's requests a fixed distance ahead (KeyRequests) reach the rows
/// already, and asking for a whole tile at once as well took 1.08x (int4) and 1.12x (int8) the
/// time of the step over a paged cache at B 8 L 8192 on Zen 5. In a scattered pool the score
/// pass's requests follow the block table too (key_prefetch()), but only kKeysAhead keys
/// ahead there (the next block's rows); without this request of the next tile as well, the int4
/// step over a scattered pool took 1.08x the time and the int8 step 0.93x (B 8 L 4096, Zen 5): kept
/// for both.
inline void prefetch_scattered_rows(const StoredRows& s, Index b, Index h, Index slot, Index n,
                                    Index width) noexcept {
  if (s.table == nullptr || n <= 0) return;
  const Index* blocks = s.table + b * s.table_stride;
  const Index first = std::max<Index>(0, slot - 1) / s.block_rows;
  const Index last = (slot + n - 1) / s.block_rows;
  bool run = true;
  for (Index i = first; i < last; ++i) run = run && blocks[i + 1] == blocks[i] + 1;
  if (run) return;
  const Index bytes = stored_row_bytes(s.element, width);
  stored_runs(s, b, h, slot, n,
              [&](const unsigned char* row, const float* scales, Index, Index count) {
                for (Index r = 0; r < count; ++r) {
                  prefetch_lines(reinterpret_cast<std::uintptr_t>(row + r * s.row_stride), bytes);
                }
                if (scales != nullptr) {
                  prefetch_lines(reinterpret_cast<std::uintptr_t>(scales),
                                 count * s.scale_row_stride * Index(sizeof(float)));
                }
              });
}

// ---- int8 keys against a quantised query: Q K^T on integer dot products ----
//
// A decode step over int8 keys quantises its query rows once per task (QuantizedQuery:
// quantize_row()'s int8 rule, one scale per row) and takes each score as an exact integer dot
// product, s = float(sum_e q_e k_e) * k_scale * (q_scale * softmax_scale), with no float copy
// of the keys. Every set and CPU computes the same integer and the same two roundings, so the
// scores have the same bits everywhere; a set gives the vector form (int8_key_scores_part():
// AVX512-VNNI's and AVX-VNNI's vpdpbusd where the CPU has them), the scalar loop here the rest.

/// No vector form in this set (or not on this CPU): false.
template <class Query>
inline bool int8_key_scores_part(const Query&, const unsigned char*, Index, const float*, Index,
                                 Index, float*, Index, const KeyPrefetch&) noexcept {
  return false;
}

/// s^T rows of n int8 keys (key j at k + j * k_rs, its scale at ks[j * ks_rs]) against the
/// query rows of q: st[j * ld + r] = float(q_r . k_j) * ks_j * q.scales[r], r < q.rows. The
/// set's vector form asks for the rows of `ahead` as it goes.
inline void int8_key_scores(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                            const float* ks, Index ks_rs, Index n, float* st, Index ld,
                            const KeyPrefetch& ahead = KeyPrefetch()) noexcept {
  if (int8_key_scores_part(q, k, k_rs, ks, ks_rs, n, st, ld, ahead)) return;
  for (Index j = 0; j < n; ++j) {
    const auto* key = reinterpret_cast<const std::int8_t*>(k + j * k_rs);
    for (Index r = 0; r < q.rows; ++r) {
      const std::int8_t* x = q.q + r * q.ld;
      std::int32_t dot = 0;
      for (Index e = 0; e < q.width; ++e) dot += std::int32_t(x[e]) * std::int32_t(key[e]);
      st[j * ld + r] = static_cast<float>(dot) * ks[j * ks_rs] * q.scales[r];
    }
  }
}

/// Quantises `rows` query rows of width d (row r at rows_of[r]) into `bytes` (kQueryBlock
/// rows of quantized_query_ld(d)) with their sums and scales (times `scale`; kQueryBlock each
/// in `sums` and `scales`) for int8_key_scores(). False, with nothing usable, when a row holds
/// a NaN or an infinity (the float path then computes those scores, IEEE).
inline bool quantize_query(const float* const* rows_of, Index rows, Index d, float scale,
                           std::int8_t* bytes, std::int32_t* sums, float* scales,
                           QuantizedQuery& q) noexcept {
  using V = Vec<float>;
  constexpr Index W = V::kWidth;
  const Index ld = quantized_query_ld(d);
  // x * 0 is NaN exactly when x is a NaN or an infinity, and a sum holding a NaN is NaN: one
  // vector pass instead of a test and a branch per element.
  auto probe = V::zero();
  for (Index r = 0; r < rows; ++r) {
    Index e = 0;
    for (; e + W <= d; e += W) probe = V::add(probe, V::mul(V::load(rows_of[r] + e), V::zero()));
    if (e < d) probe = V::add(probe, V::mul(V::load_partial(rows_of[r] + e, d - e), V::zero()));
  }
  if (V::reduce_add(probe) != 0.0f) return false;
  const Index padded = (rows + 3) / 4 * 4;
  for (Index r = 0; r < padded; ++r) {
    std::int8_t* x = bytes + r * ld;
    if (r >= rows) {
      std::copy(bytes + (rows - 1) * ld, bytes + rows * ld, x);
      sums[r] = sums[rows - 1], scales[r] = scales[rows - 1];
      continue;
    }
    // quantize_row()'s int8 rule in vectors, the same operations on each element (so the
    // same bits): top = max |x|, level = round(clamp(x * (127 / top), -127, 127)). (The
    // scalar rule, called per row, was 12 % of an int4 decode step at B8 L4096.)
    const float* row = rows_of[r];
    auto top_v = V::zero();  // (zeros past d: no change to the max)
    for (Index e = 0; e < d; e += W) {
      const auto y = e + W <= d ? V::load(row + e) : V::load_partial(row + e, d - e);
      top_v = V::max(top_v, V::max(y, V::sub(V::zero(), y)));
    }
    const float top = V::reduce_max(top_v);
    const float row_scale = top / 127.0f;
    const auto inv = V::set1(top > 0.0f ? 127.0f / top : 0.0f);
    const auto lo = V::set1(-127.0f), hi = V::set1(127.0f), magic = V::set1(12582912.0f);
    alignas(64) float level[W];
    std::int32_t sum = 0;
    for (Index e = 0; e < d; e += W) {
      const Index n = std::min(W, d - e);
      const auto y = V::min(
          V::max(V::mul(n == W ? V::load(row + e) : V::load_partial(row + e, n), inv), lo), hi);
      V::store(level, V::sub(V::add(y, magic), magic));  // round_to_level()
      for (Index i = 0; i < n; ++i) {
        x[e + i] = static_cast<std::int8_t>(static_cast<int>(level[i]));
        sum += x[e + i];
      }
    }
    std::fill(x + d, x + ld, std::int8_t(0));
    sums[r] = sum;
    scales[r] = row_scale * scale;
  }
  q.q = bytes, q.ld = ld, q.sums = sums, q.scales = scales, q.rows = rows, q.width = d;
  return true;
}

/// int8_key_scores() over the stored int8 keys slot .. slot + n - 1 of item b, head h, into
/// st (row stride ld), asking for the keys ahead and for the same keys' rows of `values` (width
/// dv; null: none) as it goes (key_prefetch()).
inline void stored_int8_scores(const StoredRows& s, Index b, Index h, Index slot, Index n,
                               const QuantizedQuery& q, float* st, Index ld,
                               const StoredRows* values = nullptr, Index dv = 0) noexcept {
  stored_runs(
      s, b, h, slot, n, [&](const unsigned char* row, const float* scales, Index j0, Index run) {
        int8_key_scores(q, row, s.row_stride, scales, s.scale_row_stride, run, st + j0 * ld, ld,
                        key_prefetch(s, values, b, h, slot + j0, run, n - j0, q.width, dv));
      });
}

// ---- int4 keys against the quantised query ----
//
// int4 keys (kInt4Block blocks of 16 bytes, q + 8 in each nibble) are scored against the same
// int8 query as int8 keys, on an exact integer dot product per piece of the row (a block, or
// the part of a block under one scale when groups do not hold whole blocks): s = (sum over
// the pieces, in order, of float(dot) * its scale) * q_scale, each product and sum rounded in
// float. Every set computes these same integers and roundings, so the scores have the same
// bits everywhere; a set gives the vector form (int4_key_scores_part(), for groups of whole
// blocks), the scalar loop here the rest.

/// No vector form in this set (or not on this CPU, or for this width and group): false.
template <class Query>
inline bool int4_key_scores_part(const Query&, const unsigned char*, Index, const float*, Index,
                                 Index, Index, float*, Index, const KeyPrefetch&) noexcept {
  return false;
}

/// s^T rows of n int4 keys (key j at k + j * k_rs, its scales, one per `group` elements, at
/// ks + j * ks_rs) against the query rows of q (see above), st[j * ld + r], r < q.rows. The
/// set's vector form asks for the rows of `ahead` as it goes.
inline void int4_key_scores(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                            const float* ks, Index ks_rs, Index group, Index n, float* st, Index ld,
                            const KeyPrefetch& ahead = KeyPrefetch()) noexcept {
  if (int4_key_scores_part(q, k, k_rs, ks, ks_rs, group, n, st, ld, ahead)) return;
  constexpr Index half = kInt4Block / 2;
  for (Index j = 0; j < n; ++j) {
    const unsigned char* key = k + j * k_rs;
    const float* scales = ks + j * ks_rs;
    for (Index r = 0; r < q.rows; ++r) {
      const std::int8_t* x = q.q + r * q.ld;
      float total = 0.0f;
      for (Index e0 = 0, e1 = 0; e0 < q.width; e0 = e1) {
        e1 = std::min({(e0 / kInt4Block + 1) * kInt4Block, (e0 / group + 1) * group, q.width});
        std::int32_t dot = 0;
        for (Index e = e0; e < e1; ++e) {
          const Index i = e % kInt4Block;
          const unsigned char byte = key[e / kInt4Block * half + i % half];
          const int nibble = i < half ? byte & 0x0F : byte >> 4;
          dot += std::int32_t(x[e]) * (nibble - 8);
        }
        const float term = static_cast<float>(dot) * scales[e0 / group];
        total = e0 == 0 ? term : total + term;
      }
      st[j * ld + r] = total * q.scales[r];
    }
  }
}

/// int4_key_scores() over the stored int4 keys slot .. slot + n - 1 of item b, head h, into
/// st (row stride ld), asking for the keys ahead and for the same keys' rows of `values` (width
/// dv; null: none) as it goes (key_prefetch()).
inline void stored_int4_scores(const StoredRows& s, Index b, Index h, Index slot, Index n,
                               const QuantizedQuery& q, float* st, Index ld,
                               const StoredRows* values = nullptr, Index dv = 0) noexcept {
  stored_runs(s, b, h, slot, n,
              [&](const unsigned char* row, const float* scales, Index j0, Index run) {
                int4_key_scores(q, row, s.row_stride, scales, s.scale_row_stride, s.group, run,
                                st + j0 * ld, ld,
                                key_prefetch(s, values, b, h, slot + j0, run, n - j0, q.width, dv));
              });
}

/// Whether stored rows of this kind may hold a NaN or an infinity (the float formats may;
/// int8 and int4 levels times finite scales never do).
inline bool stored_may_be_nonfinite(KVElement e) noexcept {
  return e != KVElement::kInt8 && e != KVElement::kInt4;
}

// ---- P V over int8 and int4 values in registers ----

/// No vector form in this set: false, nothing done (the caller dequantises the V tile).
template <class Byte>
inline bool int8_values_part(const Byte* const*, const float* const*, Index, Index, const float*,
                             Index, Index, float*) noexcept {
  return false;
}

/// No vector form in this set: false, nothing done (the caller dequantises the V tile).
template <class Byte>
inline bool int4_values_part(const Byte* const*, const float* const*, Index, Index, Index,
                             const float*, Index, Index, float*) noexcept {
  return false;
}

/// fn(rows, scales, j0, count) over the stored rows slot .. slot + n - 1 of item b, head h, at
/// most kKeyBlock at a time: each row's address and its scales' (rows[j], scales[j]: row
/// j0 + j), so that a value pass reads a paged cache's rows as a contiguous cache's, in one
/// call per tile whatever the block size. False when fn is.
template <class Fn>
bool stored_row_addresses(const StoredRows& s, Index b, Index h, Index slot, Index n, Fn&& fn) {
  const unsigned char* rows[kKeyBlock];
  const float* scales[kKeyBlock];
  for (Index j0 = 0; j0 < n; j0 += kKeyBlock) {
    const Index count = std::min(kKeyBlock, n - j0);
    stored_runs(s, b, h, slot + j0, count,
                [&](const unsigned char* row, const float* sc, Index r0, Index run) {
                  for (Index r = 0; r < run; ++r) {
                    rows[r0 + r] = row + r * s.row_stride;
                    scales[r0 + r] = sc + r * s.scale_row_stride;
                  }
                });
    if (!fn(rows, scales, j0, count)) return false;
  }
  return true;
}

/// acc (rows, dv) += P V over the stored int4 values slot .. slot + n - 1 of item b, head h
/// (each element q times its group's scale, one rounding, widened in registers), P read
/// transposed out of p^T (row stride ld), where the set has a vector form; false, nothing
/// done, where it has none.
inline bool stored_int4_values(const StoredRows& s, Index b, Index h, Index slot, Index n, Index dv,
                               const float* pt, Index ld, Index rows, float* acc) noexcept {
  return stored_row_addresses(
      s, b, h, slot, n,
      [&](const unsigned char* const* v, const float* const* vs, Index j0, Index count) {
        return int4_values_part(v, vs, s.group, count, dv, pt + j0 * ld, ld, rows, acc);
      });
}

/// acc (rows, dv) += P V over the stored int8 values slot .. slot + n - 1 of item b, head h,
/// P read transposed out of p^T (row stride ld), where the set has a vector form
/// (int8_values_part(): each row's scale folded into its weights, the bytes widened in
/// registers); false, nothing done, where it has none.
inline bool stored_int8_values(const StoredRows& s, Index b, Index h, Index slot, Index n, Index dv,
                               const float* pt, Index ld, Index rows, float* acc) noexcept {
  return stored_row_addresses(
      s, b, h, slot, n,
      [&](const unsigned char* const* v, const float* const* vs, Index j0, Index count) {
        return int8_values_part(v, vs, count, dv, pt + j0 * ld, ld, rows, acc);
      });
}

// ---- the scores of a decode step's tasks, and its 16-bit values ----
//
// A task of few query rows (a decode step's grouped heads, a short chunk: the dot-product rows
// of generic/attention.inl) over float, bfloat16 or float16 keys, in place or stored (a cache's
// rows, paged or not): where the set has a vector form, each key's elements are widened in
// registers (exactly) and multiplied in float, 4 keys x 4 rows per step, one sum per key and
// row in the set's fixed order whatever the rows and keys beside it, with no float copy of a
// tile. 16-bit values of at most 4 rows likewise. Elsewhere the float path (a widened tile,
// one dot product per key and row).

/// No vector form in this set: false, nothing done.
template <class Key>
inline bool decode_key_scores_part(const float* const*, Index, const Key*, Index, Index, Index,
                                   float, float*, Index, const KeyPrefetch&) noexcept {
  return false;
}

/// No vector form in this set: false, nothing done.
template <class Half>
inline bool half_values_part(const Half* const*, Index, Index, const float*, Index, Index, bool,
                             float*) noexcept {
  return false;
}

/// fn(type) with `type` a null pointer to the element of stored rows of kind `e` that the
/// few-row scores read in place (float rows of a paged cache, bfloat16, float16); false for
/// the other kinds.
template <class Fn>
bool with_decode_key_type(KVElement e, Fn&& fn) {
  switch (e) {
    case KVElement::kScalar:
      return fn(static_cast<const float*>(nullptr));
    case KVElement::kBFloat16:
      return fn(static_cast<const bfloat16*>(nullptr));
    case KVElement::kFloat16:
      return fn(static_cast<const float16*>(nullptr));
    default:
      return false;
  }
}

/// s^T (st[j * ld + r]) of the stored keys slot .. slot + n - 1 of item b, head h (unscaled
/// rows of d elements of Key: float rows of a paged cache, or 16-bit ones) against `rows`
/// float query rows q[r], times `scale` (decode_key_scores_part()), asking for the keys ahead
/// and for the same keys' rows of `values` (width dv; null: none) as it goes. False, nothing
/// done, where the set has no vector form.
template <class Key>
bool stored_decode_scores(const StoredRows& s, Index b, Index h, Index slot, Index n,
                          const float* const* q, Index rows, Index d, float scale, float* st,
                          Index ld, const StoredRows* values, Index dv) noexcept {
  bool done = true;
  stored_runs(s, b, h, slot, n, [&](const unsigned char* row, const float*, Index j0, Index run) {
    done = done &&
           decode_key_scores_part(
               q, rows, reinterpret_cast<const Key*>(row), s.row_stride / Index(sizeof(Key)), d,
               run, scale, st + j0 * ld, ld,
               key_prefetch(s, values, b, h, slot + j0, run, n - j0, d, dv, Index(sizeof(Key))));
  });
  return done;
}

/// acc (rows, dv) += P V over the stored 16-bit values slot .. slot + n - 1 of item b, head h
/// (n <= kKeyBlock: one tile), P read transposed out of p^T (row stride ld), widened in
/// registers, where the set has a vector form and the rows are finite; false, nothing done,
/// otherwise.
template <class Half>
bool stored_half_values(const StoredRows& s, Index b, Index h, Index slot, Index n, Index dv,
                        const float* pt, Index ld, Index rows, float* acc) noexcept {
  const Half* rows_of[kKeyBlock];
  stored_runs(s, b, h, slot, std::min(n, kKeyBlock),
              [&](const unsigned char* row, const float*, Index r0, Index run) {
                for (Index r = 0; r < run; ++r) {
                  rows_of[r0 + r] = reinterpret_cast<const Half*>(row + r * s.row_stride);
                }
              });
  return half_values_part(rows_of, std::min(n, kKeyBlock), dv, pt, ld, rows, false, acc);
}
