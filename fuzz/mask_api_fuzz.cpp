// SPDX-License-Identifier: MIT
// fuzz/mask_api_fuzz.cpp: libFuzzer target for attn's shape, stride and mask API. The bytes
// are decoded into extents (sometimes negative or mismatched), strides (padded, permuted,
// broadcast), mask parts (causal with any alignment, allowed/blocked boolean masks of rank
// 2-4, additive masks with -inf and large values, key lengths, key padding) and options
// (path, scale, dropout); the public API must either throw one of attn's documented
// exceptions (std::logic_error: ShapeError, std::invalid_argument, std::out_of_range) or
// return finite results on which the materialised and streaming paths agree, with fully
// masked rows exactly zero. A fifth mode builds views and tensors of shapes whose element or
// byte counts overflow (ShapeError, nothing allocated).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "targets.hpp"

namespace mask_api_fuzz {
namespace {

using attn::Index;
using attn::Shape;
using attn::TensorView;

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (u8() & 1) != 0; }
  /// 0..n-1 usually; with a small chance a hostile value (-1 or n + 3).
  Index extent(Index n) {
    const std::uint8_t b = u8();
    if (b == 255) return -1;
    if (b == 254) return n + 3;
    return b % n;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// Storage plus a view over it with the decoded strides (row-major, padded rows, or a
/// non-unit inner stride); the storage always covers every element the view can reach.
template <class Scalar, std::size_t Rank>
struct Strided {
  using Element = std::remove_const_t<Scalar>;
  std::unique_ptr<Element[]> storage;
  std::size_t count = 0;
  TensorView<Scalar, Rank> view;
};

template <class Scalar, std::size_t Rank>
Strided<Scalar, Rank> make_strided(const Shape<Rank>& shape, Bytes& in, bool unit_inner = true) {
  using Element = std::remove_const_t<Scalar>;
  Strided<Scalar, Rank> s;
  s.count = 1;
  s.storage = std::make_unique<Element[]>(1);
  for (const Index e : shape) {
    if (e < 0) {  // let the library reject it
      s.view = TensorView<Scalar, Rank>(s.storage.get(), shape);
      return s;
    }
  }
  Shape<Rank> strides{};
  const std::uint8_t layout = in.u8() % 3;
  Index step = 1;
  for (std::size_t r = Rank; r-- > 0;) {
    if (r == Rank - 1) {
      strides[r] = (layout == 2 && !unit_inner) ? 2 : 1;
    } else {
      strides[r] = step + (layout == 1 ? 3 : 0);  // padded rows
    }
    step = strides[r] * std::max<Index>(shape[r], 1);
  }
  Index span = 1;
  for (std::size_t r = 0; r < Rank; ++r) span += (std::max<Index>(shape[r], 1) - 1) * strides[r];
  s.count = static_cast<std::size_t>(span);
  s.storage = std::make_unique<Element[]>(s.count);
  for (std::size_t i = 0; i < s.count; ++i) {
    if constexpr (std::is_same_v<Element, bool>) {
      s.storage[i] = (in.u8() & 3) == 0;
    } else {
      s.storage[i] = static_cast<Element>(static_cast<int>(in.u8()) - 128) / Element(64);
    }
  }
  s.view = TensorView<Scalar, Rank>(s.storage.get(), shape, strides);
  return s;
}

template <class Scalar>
Scalar additive_value(std::uint8_t b) {
  if (b < 16) return -std::numeric_limits<Scalar>::infinity();
  if (b == 16) return Scalar(-1e4);
  if (b == 17) return Scalar(1e4);
  return static_cast<Scalar>(static_cast<int>(b) - 136) / Scalar(16);  // about [-7, 7]
}

template <std::size_t Rank>
Shape<Rank> mask_shape(Bytes& in, Index b, Index h, Index tq, Index tk) {
  const Index full[4] = {b, h, tq, tk};
  Shape<Rank> s{};
  for (std::size_t r = 0; r < Rank; ++r) {
    const Index want = full[4 - Rank + r];
    const std::uint8_t c = in.u8() % 8;
    s[r] = c < 5 ? want : c < 7 ? 1 : in.extent(10);  // matching, broadcast, or arbitrary
  }
  return s;
}

// Holds whatever the mask views point at.
template <class Scalar>
struct MaskParts {
  Strided<bool, 2> b2;
  Strided<bool, 3> b3;
  Strided<bool, 4> b4;
  Strided<Scalar, 2> a2;
  Strided<Scalar, 4> a4;
  Strided<bool, 2> padding;
};

template <class Scalar>
void build_mask(Bytes& in, Index b, Index h, Index tq, Index tk, MaskParts<Scalar>& parts,
                attn::AttentionMask<Scalar>& mask) {
  const std::uint8_t what = in.u8();
  if (what & 1) {
    const auto alignment = static_cast<attn::CausalAlignment>(in.u8() % 3);
    mask.causal(alignment);
  }
  if (what & 2) {
    const bool allowed = in.flag();
    switch (in.u8() % 3) {
      case 0:
        parts.b2 = make_strided<bool, 2>(mask_shape<2>(in, b, h, tq, tk), in);
        allowed ? mask.allowed(parts.b2.view) : mask.blocked(parts.b2.view);
        break;
      case 1:
        parts.b3 = make_strided<bool, 3>(mask_shape<3>(in, b, h, tq, tk), in);
        allowed ? mask.allowed(parts.b3.view) : mask.blocked(parts.b3.view);
        break;
      default:
        parts.b4 = make_strided<bool, 4>(mask_shape<4>(in, b, h, tq, tk), in);
        allowed ? mask.allowed(parts.b4.view) : mask.blocked(parts.b4.view);
        break;
    }
  }
  if (what & 4) {
    if (in.flag()) {
      parts.a2 = make_strided<Scalar, 2>(mask_shape<2>(in, b, h, tq, tk), in);
      for (std::size_t i = 0; i < parts.a2.count; ++i)
        parts.a2.storage[i] = additive_value<Scalar>(in.u8());
      mask.additive(parts.a2.view);
    } else {
      parts.a4 = make_strided<Scalar, 4>(mask_shape<4>(in, b, h, tq, tk), in);
      for (std::size_t i = 0; i < parts.a4.count; ++i)
        parts.a4.storage[i] = additive_value<Scalar>(in.u8());
      mask.additive(parts.a4.view);
    }
  }
  if (what & 8) {
    std::vector<Index> lengths;
    const Index n = in.u8() % 8 == 0 ? b + 1 : b;
    for (Index i = 0; i < n; ++i) lengths.push_back(in.extent(tk + 1));
    mask.key_lengths(lengths);
  }
  if (what & 16) {
    parts.padding =
        make_strided<bool, 2>(Shape<2>{in.u8() % 8 ? b : b + 1, in.u8() % 8 ? tk : 1}, in);
    mask.key_padding(parts.padding.view);
  }
}

template <class Scalar>
void check_results(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  const double tol = std::is_same_v<Scalar, float> ? 1e-4 : 1e-10;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) __builtin_trap();  // NaN/inf escaped
    if (std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])) > tol) __builtin_trap();
  }
}

template <class Scalar>
std::vector<Scalar> contiguous_values(TensorView<Scalar, 4> v) {
  std::vector<Scalar> out;
  for (Index i0 = 0; i0 < v.extent(0); ++i0)
    for (Index i1 = 0; i1 < v.extent(1); ++i1)
      for (Index i2 = 0; i2 < v.extent(2); ++i2)
        for (Index i3 = 0; i3 < v.extent(3); ++i3) out.push_back(v(i0, i1, i2, i3));
  return out;
}

template <class Scalar>
void fuzz_sdpa(Bytes& in) {
  const Index b = in.extent(3), h = 1 + in.extent(3), tq = in.extent(9), tk = in.extent(9),
              d = 1 + in.extent(8), dv = 1 + in.extent(8);
  auto q = make_strided<const Scalar, 4>(Shape<4>{b, h, tq, d}, in, !(in.u8() == 7));
  auto k = make_strided<const Scalar, 4>(Shape<4>{b, in.u8() == 9 ? h + 1 : h, tk, d}, in);
  auto v = make_strided<const Scalar, 4>(Shape<4>{b, h, tk, dv}, in);
  MaskParts<Scalar> parts;
  attn::AttentionMask<Scalar> mask;
  build_mask(in, b, h, tq, tk, parts, mask);
  attn::AttentionOptions options;
  const std::uint8_t o = in.u8();
  if (o & 1) options.scale = (o & 2) ? 0.5 : std::numeric_limits<double>::infinity();
  if (o & 4) options.dropout = (o & 8) ? 1.5 : 0.0;
  const Index ob = std::max<Index>(b, 0), oh = std::max<Index>(h, 0), oq = std::max<Index>(tq, 0),
              ok = std::max<Index>(tk, 0);
  std::vector<Scalar> out1(static_cast<std::size_t>(ob * oh * oq * dv) + 1), out2(out1.size()),
      weights(static_cast<std::size_t>(ob * oh * oq * ok) + 1);
  const TensorView<Scalar, 4> o1(out1.data(), {ob, oh, oq, dv}), o2(out2.data(), {ob, oh, oq, dv});
  const TensorView<Scalar, 4> w(weights.data(), {ob, oh, oq, ok});
  attn::Workspace ws;
  options.path = attn::AttentionPath::kStreaming;
  attn::scaled_dot_product_attention<Scalar>(q.view, k.view, v.view, o1, ws, mask, options);
  options.path = attn::AttentionPath::kMaterialized;
  attn::scaled_dot_product_attention_with_weights<Scalar>(q.view, k.view, v.view, o2, w, ws, mask,
                                                          options);
  check_results(contiguous_values(o1), contiguous_values(o2));
  // Fully masked rows: zero weights and zero output (never NaN).
  for (Index i0 = 0; i0 < ob; ++i0)
    for (Index i1 = 0; i1 < oh; ++i1)
      for (Index i2 = 0; i2 < oq; ++i2) {
        Scalar sum = 0;
        for (Index j = 0; j < ok; ++j) sum += w(i0, i1, i2, j);
        if (!(std::abs(sum - Scalar(1)) < Scalar(1e-3) || sum == Scalar(0))) __builtin_trap();
        if (sum == Scalar(0)) {
          for (Index e = 0; e < dv; ++e)
            if (o2(i0, i1, i2, e) != Scalar(0)) __builtin_trap();
        }
      }
}

void fuzz_view_ops(Bytes& in) {
  std::vector<float> storage(4096);
  const Shape<3> shape{in.extent(6), in.extent(6), in.extent(8)};
  const TensorView<float, 3> x(storage.data(), shape);
  (void)attn::slice(x, in.u8() % 4, in.extent(9) - 1, in.extent(9));
  (void)attn::select(x, in.u8() % 4, in.extent(9) - 1);
  (void)attn::transpose(x, in.u8() % 4, in.u8() % 4);
  (void)attn::reshape(x, Shape<2>{in.extent(20) - 1, in.extent(20)});
  const auto heads = attn::split_heads(x, in.extent(5));
  (void)attn::merge_heads(heads);
  (void)x.at(in.extent(7), in.extent(7), in.extent(9));
}

void fuzz_module(Bytes& in) {
  attn::TorchGenerator gen(in.u8());
  auto options = attn::MultiHeadAttentionOptions::pytorch(8, 1 + in.u8() % 3, in.flag());
  options.causal = in.flag();
  options.causal_alignment = static_cast<attn::CausalAlignment>(in.u8() % 3);
  const attn::MultiHeadAttention<float> mha(options, gen);
  const Index b = in.extent(3), tq = in.extent(7), tk = in.extent(7);
  auto q = make_strided<const float, 3>(Shape<3>{b, tq, in.u8() == 3 ? 7 : 8}, in);
  auto kv = make_strided<const float, 3>(Shape<3>{b, tk, 8}, in);
  MaskParts<float> parts;
  attn::AttentionMask<float> mask;
  build_mask(in, b, mha.num_heads(), tq, tk, parts, mask);
  const auto y = mha.forward(q.view, kv.view, kv.view, mask);
  const auto r = mha.forward_with_weights(q.view, kv.view, kv.view, mask);
  check_results(y.to_vector(), r.output.to_vector());
}

// Shapes near and past 2^63 elements: views (no storage: zero strides) and tensors of a
// shape whose element or byte count overflows must throw ShapeError before allocating; the
// others report the exact count.
void fuzz_sizes(Bytes& in) {
  Shape<3> shape{};
  for (Index& e : shape) {
    const std::uint8_t b = in.u8();
    e = b < 128 ? Index(b % 8) : (Index(1) << (b % 63)) - Index(in.u8() % 2);
  }
  Index count = 0;
  const bool fits = attn::detail::checked_extent_product(shape, count);
  std::size_t bytes = 0;
  const bool bytes_fit =
      fits && attn::detail::checked_bytes(static_cast<std::size_t>(count), 4, bytes);
  const float x = 0;
  TensorView<const float, 3> v;
  try {
    v = TensorView<const float, 3>(&x, shape, {0, 0, 0});
  } catch (const attn::ShapeError&) {
    if (fits) __builtin_trap();
    return;
  }
  if (!fits || v.size() != count) __builtin_trap();
  try {
    (void)attn::reshape(v, Shape<2>{-1, std::max<Index>(shape[2], 1)});
  } catch (const attn::ShapeError&) {  // e.g. zero-stride views need a copy
  }
  try {
    (void)attn::reshape(v, Shape<4>{shape[2], shape[1], shape[0], Index(1) << (in.u8() % 63)});
  } catch (const attn::ShapeError&) {
  }
  if (!bytes_fit) {
    try {
      (void)attn::Tensor<float, 3>(shape);
      __builtin_trap();  // must throw before allocating
    } catch (const attn::ShapeError&) {
    }
  } else if (bytes <= (1u << 20)) {
    if (attn::Tensor<float, 3>(shape).size() != count) __builtin_trap();
  }
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  try {
    switch (in.u8() % 5) {
      case 0:
        fuzz_sdpa<float>(in);
        break;
      case 1:
        fuzz_sdpa<double>(in);
        break;
      case 2:
        fuzz_view_ops(in);
        break;
      case 3:
        fuzz_module(in);
        break;
      default:
        fuzz_sizes(in);
        break;
    }
  } catch (const std::logic_error&) {  // ShapeError, std::invalid_argument, std::out_of_range
  }
  return 0;
}

}  // namespace mask_api_fuzz
