// SPDX-License-Identifier: MIT
// attn/tensor/overlap.hpp: whether views share memory, from their address ranges, for the
// checks that keep an output from overwriting what a call still reads.
//
// The checks work on ViewSpan, a view with its element type and rank erased: written once as
// inline functions, they are compiled once per program unit rather than once per pair of view
// types (a hundred instantiations in a unit of the test suite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// A view's memory footprint with its element type and rank erased: its first address, its
/// element size, and its extents and strides (borrowed from the view, which must outlive it).
struct ViewSpan {
  const void* data = nullptr;
  std::size_t element_size = 0;
  const Index* shape = nullptr;
  const Index* strides = nullptr;
  std::size_t rank = 0;
};

template <class Scalar, std::size_t Rank>
ViewSpan view_span(const TensorView<Scalar, Rank>& v) noexcept {
  return {v.data(), sizeof(Scalar), v.shape().data(), v.strides().data(), Rank};
}

inline bool span_empty(const ViewSpan& v) noexcept {
  for (std::size_t r = 0; r < v.rank; ++r) {
    if (v.shape[r] == 0) return true;
  }
  return false;
}

/// The bytes a view can reach, [begin, end) as addresses; begin == end for an empty view.
/// A range too large for the address space saturates at the top (it then overlaps
/// everything above its start, the conservative answer).
struct ByteRange {
  std::uintptr_t begin = 0, end = 0;
};

inline ByteRange byte_range(const ViewSpan& v) noexcept {
  if (span_empty(v)) return {};
  // last element's offset: sum of (extent - 1) * stride (strides are never negative)
  std::size_t last = 0;
  bool fits = true;
  for (std::size_t r = 0; r < v.rank && fits; ++r) {
    std::size_t term = 0;
    fits = checked_mul(static_cast<std::size_t>(v.shape[r] - 1),
                       static_cast<std::size_t>(v.strides[r]), term) &&
           checked_add(last, term, last);
  }
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data);
  const std::uintptr_t top = std::numeric_limits<std::uintptr_t>::max();
  std::size_t bytes = 0;
  fits = fits && last < std::numeric_limits<std::size_t>::max() &&
         checked_mul(last + 1, v.element_size, bytes) && bytes <= top - begin;
  return {begin, fits ? begin + bytes : top};
}

template <class Scalar, std::size_t Rank>
ByteRange byte_range(const TensorView<Scalar, Rank>& v) noexcept {
  return byte_range(view_span(v));
}

/// True when the address ranges of two views intersect (element types may differ). Two views
/// whose ranges interleave without sharing an element (the even and odd columns of one
/// matrix) count as overlapping too: the test is cheap and never misses a real overlap.
inline bool overlaps(const ViewSpan& a, const ViewSpan& b) noexcept {
  const ByteRange x = byte_range(a), y = byte_range(b);
  return x.begin != x.end && y.begin != y.end && x.begin < y.end && y.begin < x.end;
}

template <class A, std::size_t RankA, class B, std::size_t RankB>
bool overlaps(const TensorView<A, RankA>& a, const TensorView<B, RankB>& b) noexcept {
  return overlaps(view_span(a), view_span(b));
}

/// True when two different indices of `v` may address the same element: a zero stride on an
/// axis longer than 1 (a broadcast), or strides that interleave. Sufficient test: ordered by
/// stride, each axis's stride must exceed the span of the axes below it, which every layout
/// the view ops make from a tensor satisfies. (Quadratic in the rank rather than sorted: the
/// rank is small.)
inline bool has_internal_overlap(const ViewSpan& v) noexcept {
  if (span_empty(v)) return false;
  for (std::size_t i = 0; i < v.rank; ++i) {
    if (v.shape[i] <= 1) continue;
    Index span = 0;  // largest offset the axes ordered below axis i reach
    for (std::size_t j = 0; j < v.rank; ++j) {
      const bool below = v.strides[j] < v.strides[i] || (v.strides[j] == v.strides[i] && j < i);
      if (j == i || v.shape[j] <= 1 || !below) continue;
      Index reach = 0;
      if (!checked_mul(v.strides[j], v.shape[j] - 1, reach) || !checked_add(span, reach, span)) {
        return true;  // an offset past the index range cannot be told apart: rejected too
      }
    }
    if (v.strides[i] <= span) return true;
  }
  return false;
}

template <class Scalar, std::size_t Rank>
bool has_internal_overlap(const TensorView<Scalar, Rank>& v) noexcept {
  return has_internal_overlap(view_span(v));
}

/// Throws ShapeError("attn::<where>: <name> has shape ... and strides ..., so some of its
/// elements share memory ...") when `v`, an output, has internal overlap: its elements would
/// be written several times, by several threads.
inline void require_distinct_elements(const char* where, const char* name, const ViewSpan& v) {
  require(!has_internal_overlap(v), where, [&] {
    return std::string(name) + " has shape " + to_string(v.shape, v.rank) + " and strides " +
           to_string(v.strides, v.rank) +
           ", so some of its elements share memory (a zero or interleaved stride); an output "
           "needs one location per element";
  });
}

template <class Scalar, std::size_t Rank>
void require_distinct_elements(const char* where, const char* name,
                               const TensorView<Scalar, Rank>& v) {
  require_distinct_elements(where, name, view_span(v));
}

/// Throws ShapeError naming both views when `written` (an output) shares memory with `other`
/// (an input the call still reads, or another output).
inline void require_disjoint(const char* where, const char* written_name, const ViewSpan& written,
                             const char* other_name, const ViewSpan& other) {
  require(!overlaps(written, other), where, [&] {
    return std::string(written_name) + " " + to_string(written.shape, written.rank) + " overlaps " +
           other_name + " " + to_string(other.shape, other.rank) +
           " in memory; pass an output that shares no memory with it";
  });
}

template <class A, std::size_t RankA, class B, std::size_t RankB>
void require_disjoint(const char* where, const char* written_name,
                      const TensorView<A, RankA>& written, const char* other_name,
                      const TensorView<B, RankB>& other) {
  require_disjoint(where, written_name, view_span(written), other_name, view_span(other));
}

}  // namespace detail
ATTN_NAMESPACE_END
