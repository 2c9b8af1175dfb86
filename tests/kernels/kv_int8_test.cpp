// SPDX-License-Identifier: MIT
// tests/kernels/kv_int8_test.cpp: the int8 kernels of a decode step over an int8 KVCache, per
// kernel set: the scores of int8 keys against a quantised query (exact integer dot products,
// AVX512-VNNI and AVX-VNNI where the CPU has them) have the same bits on every set, and the P V
// product over int8 value rows (widened in registers, or on 16-bit weight levels with
// AVX512-VNNI or AVX-VNNI) matches a double product within the bound of its form. The attention
// through them is tested in tests/attention/kv_cache_quantized_test.cpp. The int4 forms (where a
// set has them) against the order their scores are defined in and a double product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"

namespace kv_int8_test {

namespace {

using attn::Index;
using attn::Isa;
using attn::KVElement;

// One set's int8 kernels of a decode step: the scores of int8 keys against a quantised query
// (AVX512-VNNI on the avx512 set where the CPU has it, the scalar loop elsewhere) and the P V
// product over int8 values (false where the set has no vector form).
struct Int8Kernels {
  Isa isa;
  void (*scores)(const attn::detail::QuantizedQuery&, const unsigned char*, Index, const float*,
                 Index, Index, float*, Index, const attn::detail::KeyPrefetch&);
  bool (*quantize)(const float* const*, Index, Index, float, std::int8_t*, std::int32_t*, float*,
                   attn::detail::QuantizedQuery&);
  bool (*values)(const attn::detail::StoredRows&, Index, Index, Index, Index, Index, const float*,
                 Index, Index, float*);
  void (*int4_scores)(const attn::detail::StoredRows&, Index, Index, Index, Index,
                      const attn::detail::QuantizedQuery&, float*, Index,
                      const attn::detail::StoredRows*, Index);
  bool (*int4_values)(const attn::detail::StoredRows&, Index, Index, Index, Index, Index,
                      const float*, Index, Index, float*);
  // The avx512 and avx2 sets' form on a CPU without AVX512-VNNI or AVX-VNNI (vpmaddwd),
  // tested on any CPU with AVX-512 or AVX2; null elsewhere.
  bool (*madd)(const attn::detail::QuantizedQuery&, const unsigned char*, Index, const float*,
               Index, Index, float*, Index, const attn::detail::KeyPrefetch&) = nullptr;
  // The values' float form where the set's own is on 16-bit weight levels (the avx512 and avx2
  // sets' on a CPU without AVX512-VNNI or AVX-VNNI, and for weights that are not finite),
  // tested on any CPU with the set.
  bool float_form = false;
  // Whether this entry's values are on 16-bit weight levels (the avx512 set with AVX512-VNNI,
  // the avx2 set with AVX-VNNI).
  bool levels() const {
    return !float_form && ((isa == Isa::kAvx512 && attn::detail::cpu_has_avx512_vnni()) ||
                           (isa == Isa::kAvx2 && attn::detail::cpu_has_avx_vnni()));
  }
};

#if ATTN_KERNELS_X86
// A set's float forms of the int8 and int4 values (the avx512 and avx2 sets', whose own forms
// are on 16-bit weight levels where the CPU has VNNI), as stored_int8_values() and
// stored_int4_values() call them, 4 query rows at a time. The avx2 set's take value widths that
// are multiples of 16 only, as its int8_values_part() and int4_values_part() do.
#define ATTN_FLOAT_FORMS_(set, any_width)                                                          \
  bool set##_int8_values_fma(const attn::detail::StoredRows& s, Index b, Index h, Index slot,      \
                             Index n, Index dv, const float* pt, Index ld, Index rows,             \
                             float* acc) {                                                         \
    if (!(any_width) && dv % 16 != 0) return false;                                                \
    return attn::kernels::set::stored_row_addresses(                                               \
        s, b, h, slot, n,                                                                          \
        [&](const unsigned char* const* v, const float* const* vs, Index j0, Index count) {        \
          for (Index r0 = 0; r0 < rows; r0 += 4) {                                                 \
            attn::kernels::set::int8_values_fma(v, vs, count, dv, pt + j0 * ld, ld, rows, r0,      \
                                                acc);                                              \
          }                                                                                        \
          return true;                                                                             \
        });                                                                                        \
  }                                                                                                \
  bool set##_int4_values_fma(const attn::detail::StoredRows& s, Index b, Index h, Index slot,      \
                             Index n, Index dv, const float* pt, Index ld, Index rows,             \
                             float* acc) {                                                         \
    if (s.group % attn::detail::kInt4Block != 0 && s.group < dv) return false;                     \
    if (!(any_width) && dv % 16 != 0) return false;                                                \
    return attn::kernels::set::stored_row_addresses(                                               \
        s, b, h, slot, n,                                                                          \
        [&](const unsigned char* const* v, const float* const* vs, Index j0, Index count) {        \
          for (Index r0 = 0; r0 < rows; r0 += 4) {                                                 \
            attn::kernels::set::int4_values_fma(v, vs, s.group, count, dv, pt + j0 * ld, ld, rows, \
                                                r0, acc);                                          \
          }                                                                                        \
          return true;                                                                             \
        });                                                                                        \
  }
ATTN_FLOAT_FORMS_(avx512, true)
ATTN_FLOAT_FORMS_(avx2, false)
#undef ATTN_FLOAT_FORMS_
#endif

std::vector<Int8Kernels> int8_kernels() {
  std::vector<Int8Kernels> all;
  for (const Isa isa : attn::test::runnable_sets()) {
    switch (isa) {
#define ATTN_INT8_KERNELS_(set)                                                                    \
  all.push_back({isa, &attn::kernels::set::int8_key_scores, &attn::kernels::set::quantize_query,   \
                 &attn::kernels::set::stored_int8_values, &attn::kernels::set::stored_int4_scores, \
                 &attn::kernels::set::stored_int4_values});                                        \
  break;
      case Isa::kScalar:
        ATTN_INT8_KERNELS_(scalar)
#if ATTN_KERNELS_X86
      case Isa::kSse2:
        ATTN_INT8_KERNELS_(sse2)
      case Isa::kAvx2:  // AVX-VNNI where the CPU has it; its vpmaddwd form tested as `madd`
        all.push_back(
            {isa, &attn::kernels::avx2::int8_key_scores, &attn::kernels::avx2::quantize_query,
             &attn::kernels::avx2::stored_int8_values, &attn::kernels::avx2::stored_int4_scores,
             &attn::kernels::avx2::stored_int4_values, &attn::kernels::avx2::int8_key_scores_madd});
        all.push_back({isa, &attn::kernels::avx2::int8_key_scores,
                       &attn::kernels::avx2::quantize_query, &avx2_int8_values_fma,
                       &attn::kernels::avx2::stored_int4_scores, &avx2_int4_values_fma, nullptr,
                       true});
        break;
      case Isa::kAvx512:
        all.push_back(
            {isa, &attn::kernels::avx512::int8_key_scores, &attn::kernels::avx512::quantize_query,
             &attn::kernels::avx512::stored_int8_values, &attn::kernels::avx512::stored_int4_scores,
             &attn::kernels::avx512::stored_int4_values,
             &attn::kernels::avx512::int8_key_scores_madd});
        all.push_back({isa, &attn::kernels::avx512::int8_key_scores,
                       &attn::kernels::avx512::quantize_query, &avx512_int8_values_fma,
                       &attn::kernels::avx512::stored_int4_scores, &avx512_int4_values_fma, nullptr,
                       true});
        break;
#endif
#undef ATTN_INT8_KERNELS_
      default:
        break;
    }
  }
  return all;
}

// Up to `ld` query rows of `d` elements quantised by a set's quantize_query() with a decode
// task's buffers (scale 0.5), as the kernel quantises them once per task.
struct QuantizedRows {
  std::vector<std::int8_t> bytes;
  std::vector<std::int32_t> sums;
  std::vector<float> scales;
  attn::detail::QuantizedQuery qq;
  Index d;
  QuantizedRows(Index ld, Index d_)
      : bytes(static_cast<std::size_t>(ld * attn::detail::quantized_query_ld(d_))),
        sums(static_cast<std::size_t>(ld)),
        scales(static_cast<std::size_t>(ld)),
        d(d_) {}
  bool by(const Int8Kernels& set, const float* const* q_rows, Index rows) {
    return set.quantize(q_rows, rows, d, 0.5f, bytes.data(), sums.data(), scales.data(), qq);
  }
};

// acc (rows, d, started at 0.25) after acc += P V over n int8 rows k (scales ks), P read out
// of pt (pt[j * ld + r]), against a double product. The float forms: 1e-5 relative over the
// whole output (float accumulation of a few keys). The vpdpwssd forms (the avx512 set's where the
// CPU has AVX512-VNNI, the avx2 set's where it has AVX-VNNI) round each weight w = p * scale to a
// 16-bit level of its row's largest |w| (top): each element within top / 65534 * sum_j |level_j| of
// the double product, plus float rounding (1e-6 of the sum of the terms' magnitudes).
void expect_int8_values(const Int8Kernels& set, const std::vector<float>& pt, Index ld, Index rows,
                        Index n, const std::vector<unsigned char>& k, const std::vector<float>& ks,
                        Index d, const std::vector<float>& acc, double start = 0.25) {
  const bool levels = set.levels();
  double num = 0, den = 0;
  for (Index r = 0; r < rows; ++r) {
    double top = 0;
    for (Index j = 0; j < n; ++j) {
      const float w = pt[static_cast<std::size_t>(j * ld + r)] * ks[static_cast<std::size_t>(j)];
      top = std::max(top, static_cast<double>(std::fabs(w)));
    }
    for (Index e = 0; e < d; ++e) {
      double want = start, magnitude = start, level_sum = 0;
      for (Index j = 0; j < n; ++j) {
        const double w = static_cast<double>(pt[static_cast<std::size_t>(j * ld + r)]) *
                         ks[static_cast<std::size_t>(j)];
        const double x = static_cast<std::int8_t>(k[static_cast<std::size_t>(j * d + e)]);
        want += w * x, magnitude += std::fabs(w * x), level_sum += std::fabs(x);
      }
      const double got = acc[static_cast<std::size_t>(r * d + e)];
      if (levels) {
        EXPECT_LE(std::fabs(got - want), top / 65534 * level_sum + 1e-6 * magnitude)
            << "row " << r << ", element " << e;
      }
      num += (got - want) * (got - want), den += want * want;
    }
  }
  if (!levels) {
    EXPECT_LT(std::sqrt(num / den), 1e-5);
  }
}

TEST(KVInt8Kernels, ScoresHaveTheSameBitsOnEverySetAndValuesMatchADoubleProduct) {
  // Widths 40 (a partial 64-byte chunk), 64 and 128 (query chunks in registers) and 200 (any
  // width); 5 query rows (a group of 4 and a padded one) and 13 keys (a partial group of 4).
  // Scores: exact integer dot products and the same two roundings on every set, so the bits
  // of the scalar loop, checked against a double product of the levels (an integer below
  // 2^24: exact) times the two scales to 1e-6. Values: acc += P V over int8 rows against a
  // double product (expect_int8_values()).
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> level(-127, 127);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), positive(0.01f, 0.02f);
  const Index rows = 5, n = 13, ld = attn::detail::kQueryBlock;
  for (const Index d : {Index(40), Index(64), Index(128), Index(200)}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    std::vector<unsigned char> k(static_cast<std::size_t>(n * d));
    std::vector<float> ks(static_cast<std::size_t>(n)), q(static_cast<std::size_t>(rows * d));
    for (auto& x : k) x = static_cast<unsigned char>(static_cast<std::int8_t>(level(gen)));
    for (auto& x : ks) x = positive(gen);
    for (auto& x : q) x = uniform(gen);
    const float* q_rows[rows];
    for (Index r = 0; r < rows; ++r) q_rows[r] = q.data() + r * d;
    std::vector<float> first, first_levels;
    for (const Int8Kernels& set : int8_kernels()) {
      SCOPED_TRACE(attn::isa_name(set.isa));
      QuantizedRows quantized(ld, d);
      ASSERT_TRUE(quantized.by(set, q_rows, rows));
      const attn::detail::QuantizedQuery& qq = quantized.qq;
      std::vector<float> st(static_cast<std::size_t>(n * ld), -1.0f);
      // (Asking for rows ahead, here the keys' own, changes no bit.)
      attn::detail::KeyPrefetch ahead;
      ahead.k_bytes = d, ahead.v = k.data(), ahead.v_rs = d, ahead.v_bytes = d;
      set.scores(qq, k.data(), d, ks.data(), 1, n, st.data(), ld, ahead);
      for (Index j = 0; j < n; ++j) {
        for (Index r = 0; r < rows; ++r) {
          double dot = 0;
          for (Index e = 0; e < d; ++e) {
            dot += static_cast<double>(qq.q[r * qq.ld + e]) *
                   static_cast<std::int8_t>(k[static_cast<std::size_t>(j * d + e)]);
          }
          const double want = dot * ks[static_cast<std::size_t>(j)] * qq.scales[r];
          EXPECT_NEAR(st[static_cast<std::size_t>(j * ld + r)], want, 1e-6 * (1 + std::fabs(want)));
        }
      }
      std::vector<float> got;
      for (Index j = 0; j < n; ++j) {
        for (Index r = 0; r < rows; ++r) got.push_back(st[static_cast<std::size_t>(j * ld + r)]);
      }
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << "scores differ from the first set's";
      if (set.madd != nullptr) {
        std::vector<float> madd(st.size(), -1.0f);
        if (set.madd(qq, k.data(), d, ks.data(), 1, n, madd.data(), ld, ahead)) {
          for (Index j = 0; j < n; ++j) {
            for (Index r = 0; r < rows; ++r) {
              const auto at = static_cast<std::size_t>(j * ld + r);
              EXPECT_EQ(madd[at], st[at]) << "vpmaddwd form, key " << j << ", row " << r;
            }
          }
        }
      }
      // Values: P (the scores as weights) times the keys' rows read as values.
      attn::detail::StoredRows v;
      v.element = KVElement::kInt8, v.data = k.data(), v.row_stride = d;
      v.scales = ks.data(), v.scale_row_stride = 1;
      std::vector<float> acc(static_cast<std::size_t>(rows * d), 0.25f);
      if (!set.values(v, 0, 0, 0, n, d, st.data(), ld, rows, acc.data())) continue;
      expect_int8_values(set, st, ld, rows, n, k, ks, d, acc);
      // The two sets' level forms: the same levels and exact integer sums, the same bits.
      if (set.levels()) {
        if (first_levels.empty()) first_levels = acc;
        EXPECT_EQ(acc, first_levels) << "values differ from the first level form's";
      }
    }
  }
}

TEST(KVInt8Kernels, ValuesOfAFullTileOfExtremeLevels) {
  // A whole tile (kKeyBlock keys) of the levels +-127 under weights of one sign and of both:
  // the largest integer sums the vpdpwssd form makes (128 x 32767 x 127 per lane, under 2^31),
  // and its pairs of keys over every element.
  const Index rows = 4, n = attn::detail::kKeyBlock, ld = attn::detail::kQueryBlock, d = 128;
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), positive(0.5f, 1.0f);
  std::vector<unsigned char> k(static_cast<std::size_t>(n * d));
  for (Index j = 0; j < n; ++j) {
    for (Index e = 0; e < d; ++e) {
      k[static_cast<std::size_t>(j * d + e)] = static_cast<unsigned char>(
          static_cast<std::int8_t>((e % 3 == 0 || (j + e) % 5 == 0) ? -127 : 127));
    }
  }
  std::vector<float> ks(static_cast<std::size_t>(n), 0.75f);
  attn::detail::StoredRows v;
  v.element = KVElement::kInt8, v.data = k.data(), v.row_stride = d;
  v.scales = ks.data(), v.scale_row_stride = 1;
  // Then weights near 1e-36 in rows 1 and 3 (p ~ e^-80), into accumulators at 0: the levels'
  // scale 32767 / top would overflow, and such rows take the float form.
  for (const int kind : {0, 1, 2}) {
    SCOPED_TRACE(kind == 0 ? "positive weights" : kind == 1 ? "weights of both signs" : "tiny");
    std::vector<float> pt(static_cast<std::size_t>(n * ld), 0.0f);
    for (Index j = 0; j < n; ++j) {
      for (Index r = 0; r < rows; ++r) {
        const float tiny = r % 2 == 1 ? 1e-36f : 1.0f;
        pt[static_cast<std::size_t>(j * ld + r)] =
            r == 0 ? 1.0f : (kind == 1 ? uniform(gen) : positive(gen) * (kind == 2 ? tiny : 1.0f));
      }
    }
    const float start = kind == 2 ? 0.0f : 0.25f;
    for (const Int8Kernels& set : int8_kernels()) {
      SCOPED_TRACE(attn::isa_name(set.isa));
      std::vector<float> acc(static_cast<std::size_t>(rows * d), start);
      if (!set.values(v, 0, 0, 0, n, d, pt.data(), ld, rows, acc.data())) continue;
      expect_int8_values(set, pt, ld, rows, n, k, ks, d, acc, start);
    }
  }
}

TEST(KVInt8Kernels, ValuesOnSoftmaxWeightsWithinTheirRelativeError) {
  // P as a decode step makes it (exp(s - max s) over a tile, scores of standard deviation 0.5,
  // 2 and 5), value rows of random levels and scales near 0.01, 4 query rows, a whole tile,
  // 50 tiles each: ||P V - double|| / ||double||, printed per set. The float forms round each
  // product and sum (about 2e-7); the 16-bit weight levels (the avx512 set with AVX512-VNNI,
  // the avx2 set with AVX-VNNI) about 2^-16 of a tile's largest weight per weight (measured 3e-5 to
  // 7e-5). Both within 1e-4, the figure docs/kv_cache.md states.
  const Index n = attn::detail::kKeyBlock, d = 128, rows = 4, ld = attn::detail::kQueryBlock;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(-127, 127);
  for (const float spread : {0.5f, 2.0f, 5.0f}) {
    for (const Int8Kernels& set : int8_kernels()) {
      SCOPED_TRACE(attn::isa_name(set.isa));
      std::mt19937 gen(23);
      double num = 0, den = 0;
      bool ran = true;
      for (int tile = 0; tile < 50 && ran; ++tile) {
        std::vector<unsigned char> k(static_cast<std::size_t>(n * d));
        for (auto& x : k) x = static_cast<unsigned char>(static_cast<std::int8_t>(level(gen)));
        std::vector<float> ks(static_cast<std::size_t>(n));
        for (auto& x : ks) x = 0.01f * (1.0f + 0.3f * std::fabs(normal(gen)));
        std::vector<float> pt(static_cast<std::size_t>(n * ld), 0.0f),
            s(static_cast<std::size_t>(n));
        for (Index r = 0; r < rows; ++r) {
          for (auto& x : s) x = spread * normal(gen);
          const float top = *std::max_element(s.begin(), s.end());
          for (Index j = 0; j < n; ++j) {
            pt[static_cast<std::size_t>(j * ld + r)] =
                std::exp(s[static_cast<std::size_t>(j)] - top);
          }
        }
        attn::detail::StoredRows v;
        v.element = KVElement::kInt8, v.data = k.data(), v.row_stride = d;
        v.scales = ks.data(), v.scale_row_stride = 1;
        std::vector<float> acc(static_cast<std::size_t>(rows * d), 0.0f);
        ran = set.values(v, 0, 0, 0, n, d, pt.data(), ld, rows, acc.data());
        for (Index r = 0; r < rows && ran; ++r) {
          for (Index e = 0; e < d; ++e) {
            double want = 0;
            for (Index j = 0; j < n; ++j) {
              want += static_cast<double>(pt[static_cast<std::size_t>(j * ld + r)]) *
                      ks[static_cast<std::size_t>(j)] *
                      static_cast<std::int8_t>(k[static_cast<std::size_t>(j * d + e)]);
            }
            const double diff = acc[static_cast<std::size_t>(r * d + e)] - want;
            num += diff * diff, den += want * want;
          }
        }
      }
      if (!ran) continue;
      const double error = std::sqrt(num / den);
      std::printf("[ accuracy ] int8 P V, %-6s%s score sd %.1f: %.2e\n", attn::isa_name(set.isa),
                  set.float_form ? " (float form)" : "", static_cast<double>(spread), error);
      EXPECT_LT(error, 1e-4);
    }
  }
}

TEST(KVInt8Kernels, Int4ScoresFollowTheirDefinitionAndValuesMatchADoubleProduct) {
  // Widths 40 (a partial block), 80 (two blocks and a half: the values' last 16 elements
  // alone), 96, 128 (one 64-byte chunk) and 200 (two, the second partial); a scale per 32 elements,
  // per 64, per 48 (blocks split between two scales: the scalar loop on every set) and per row; 5
  // query rows and 13 keys. Scores: each piece's exact integer dot product times its scale, added
  // piece by piece in float, times the query's scale: that float computation's bits, on every set.
  // Values: acc += P V over the int4 rows against a double product, to 1e-5 relative (float
  // accumulation over 13 keys) or, on 16-bit weight levels, within their bound per element.
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const Index rows = 5, n = 13, ld = attn::detail::kQueryBlock, kBlock = attn::detail::kInt4Block;
  for (const Index d : {Index(40), Index(80), Index(96), Index(128), Index(200)}) {
    for (const Index group : {Index(32), Index(64), Index(48), Index(0)}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " group=" + std::to_string(group));
      const Index g = group > 0 ? group : d;
      const Index row_bytes = attn::detail::stored_row_bytes(KVElement::kInt4, d);
      const Index scales_per_row = (d + g - 1) / g;
      std::vector<unsigned char> k(static_cast<std::size_t>(n * row_bytes));
      std::vector<float> ks(static_cast<std::size_t>(n * scales_per_row));
      std::vector<float> x(static_cast<std::size_t>(d)), q(static_cast<std::size_t>(rows * d));
      for (Index j = 0; j < n; ++j) {
        for (auto& e : x) e = uniform(gen);
        attn::detail::quantize_row(KVElement::kInt4, x.data(), 1, d, g, k.data() + j * row_bytes,
                                   ks.data() + j * scales_per_row);
      }
      for (auto& e : q) e = uniform(gen);
      const float* q_rows[rows];
      for (Index r = 0; r < rows; ++r) q_rows[r] = q.data() + r * d;
      attn::detail::StoredRows stored;
      stored.element = KVElement::kInt4, stored.data = k.data(), stored.row_stride = row_bytes;
      stored.scales = ks.data(), stored.scale_row_stride = scales_per_row, stored.group = g;
      std::vector<float> level(static_cast<std::size_t>(d));  // a row's levels (scale 1)
      std::vector<float> first_levels, weights(static_cast<std::size_t>(n * rows));
      for (auto& w : weights) w = uniform(gen);
      for (const Int8Kernels& set : int8_kernels()) {
        SCOPED_TRACE(attn::isa_name(set.isa));
        QuantizedRows quantized(ld, d);
        ASSERT_TRUE(quantized.by(set, q_rows, rows));
        const attn::detail::QuantizedQuery& qq = quantized.qq;
        std::vector<float> st(static_cast<std::size_t>(n * ld), -1.0f);
        set.int4_scores(stored, 0, 0, 0, n, qq, st.data(), ld, &stored, d);
        {
          for (Index j = 0; j < n; ++j) {
            const float one = 1.0f;
            attn::detail::dequantize_row(KVElement::kInt4, k.data() + j * row_bytes, &one, d + 1, d,
                                         level.data());
            for (Index r = 0; r < rows; ++r) {
              float total = 0.0f;
              // Pieces: blocks, split where a group ends inside one.
              for (Index e0 = 0, e1 = 0; e0 < d; e0 = e1) {
                e1 = std::min({(e0 / kBlock + 1) * kBlock, (e0 / g + 1) * g, d});
                std::int32_t dot = 0;
                for (Index e = e0; e < e1; ++e) {
                  dot += qq.q[r * qq.ld + e] * static_cast<std::int32_t>(level[e]);
                }
                const float term = static_cast<float>(dot) * ks[j * scales_per_row + e0 / g];
                total = e0 == 0 ? term : total + term;
              }
              EXPECT_EQ(st[static_cast<std::size_t>(j * ld + r)], total * qq.scales[r])
                  << "key " << j << ", row " << r;
            }
          }
        }
        // Values: P (any finite numbers, the same for every set) times the keys' rows as values.
        for (Index j = 0; j < n; ++j) {
          for (Index r = 0; r < rows; ++r)
            st[j * ld + r] = weights[static_cast<std::size_t>(j * rows + r)];
        }
        std::vector<float> acc(static_cast<std::size_t>(rows * d), 0.25f);
        if (!set.int4_values(stored, 0, 0, 0, n, d, st.data(), ld, rows, acc.data())) continue;
        // The vpdpwssd forms (avx512 with AVX512-VNNI, avx2 with AVX-VNNI; blocks under one
        // scale): each weight
        // p * scale as a 16-bit level of the largest |p * scale| of its row and scale, so each
        // element within top / 65534 * sum_j |q_j| of the double product, plus float rounding.
        const bool levels = set.levels() && (g % kBlock == 0 || g >= d);
        double num = 0, den = 0;
        const auto at = [](Index i) { return static_cast<std::size_t>(i); };
        std::vector<double> want(at(rows * d), 0.25), magnitude(at(rows * d), 0.25);
        std::vector<double> level_sum(at(d), 0.0), top(at(rows * scales_per_row), 0.0);
        std::vector<float> q_level(at(d));
        for (Index j = 0; j < n; ++j) {
          attn::detail::dequantize_row(KVElement::kInt4, k.data() + j * row_bytes,
                                       ks.data() + j * scales_per_row, g, d, level.data());
          const float one = 1.0f;
          attn::detail::dequantize_row(KVElement::kInt4, k.data() + j * row_bytes, &one, d + 1, d,
                                       q_level.data());
          for (Index e = 0; e < d; ++e) level_sum[at(e)] += std::fabs(q_level[at(e)]);
          for (Index r = 0; r < rows; ++r) {
            const float p = st[at(j * ld + r)];
            for (Index sc = 0; sc < scales_per_row; ++sc) {
              top[at(r * scales_per_row + sc)] =
                  std::max(top[at(r * scales_per_row + sc)],
                           static_cast<double>(std::fabs(p * ks[at(j * scales_per_row + sc)])));
            }
            for (Index e = 0; e < d; ++e) {
              want[at(r * d + e)] += static_cast<double>(p) * level[at(e)];
              magnitude[at(r * d + e)] += std::fabs(static_cast<double>(p) * level[at(e)]);
            }
          }
        }
        for (Index r = 0; r < rows; ++r) {
          for (Index e = 0; e < d; ++e) {
            const double diff = acc[at(r * d + e)] - want[at(r * d + e)];
            if (levels) {
              EXPECT_LE(std::fabs(diff),
                        top[at(r * scales_per_row + e / g)] / 65534 * level_sum[at(e)] +
                            1e-6 * magnitude[at(r * d + e)])
                  << "row " << r << ", element " << e;
            }
            num += diff * diff, den += want[at(r * d + e)] * want[at(r * d + e)];
          }
        }
        if (!levels) {
          EXPECT_LT(std::sqrt(num / den), 1e-5);
        } else {  // the two sets' level forms: the same bits
          if (first_levels.empty()) first_levels = acc;
          EXPECT_EQ(acc, first_levels) << "values differ from the first level form's";
        }
      }
    }
  }
}

}  // namespace
}  // namespace kv_int8_test
