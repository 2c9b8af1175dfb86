// SPDX-License-Identifier: MIT
// attn/nn/gradients.hpp: Gradients<Scalar>, one buffer per named parameter of a module, laid
// out like the module's own memory: what backward passes add into and optimizers read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Calls fn(offset) for every element of a parameter's matrix view (a rank-1 parameter is
/// (1, n)), offsets from its data(): valid in every buffer that mirrors its layout (its
/// gradient, an optimizer's moments). A contiguous parameter is one flat loop.
template <class Scalar, class Fn>
void for_each_parameter_offset(const TensorView<Scalar, 2>& m, Fn&& fn) {
  const Index rows = m.extent(0), cols = m.extent(1);
  if (m.stride(1) == 1 && (rows == 1 || m.stride(0) == cols)) {
    const Index n = rows * cols;
    for (Index o = 0; o < n; ++o) fn(o);
    return;
  }
  for (Index r = 0; r < rows; ++r) {
    for (Index c = 0; c < cols; ++c) fn(r * m.stride(0) + c * m.stride(1));
  }
}

}  // namespace detail

/// One buffer per parameter of a module: the gradients its backward adds into, under the
/// names, in the order and with the shapes of the ParameterList it was made from
/// (`Gradients<float> grads(mha.named_parameters());`). Optimizers keep their per-parameter
/// state (moments, momentum) in the same kind of object.
///
/// Layout: a gradient has its parameter's memory layout. The parameters' storage is
/// mirrored block by block: parameters that lie next to each other in the module's memory
/// get gradients that lie next to each other in the same way. So
/// - the gradient of notebook 003's raw W_query (d_in, d_out), the transpose of the stored
///   weight, is the transpose of a row-major (d_out, d_in) block, like the parameter;
/// - W_query.weight, W_key.weight and W_value.weight of a fused (3 D, d_in) weight have
///   gradients that together form one contiguous (3 D, d_in) block, which a backward fills
///   with one GEMM, whatever names the list uses.
/// A backward pass finds the gradient of any view of the module's parameter memory (a whole
/// weight, part of one, or a block several names share) with of(view); an optimizer walks a
/// parameter and its gradient with the same offsets.
///
/// Only the constructor and copies allocate; zero(), of() and the accessors never do. The
/// gradients refer to the parameters' addresses: a Gradients made for one module does not
/// fit a copy of it (of() throws), while moving the module keeps its weights in place.
///
/// @tparam Scalar float or double; or bfloat16 or float16, the gradients of a module of that
///         type (as PyTorch keeps a 16-bit parameter's .grad in its type; see
///         optim::MixedPrecision).
template <class Scalar>
class Gradients {
  static_assert(std::is_floating_point_v<Scalar> || std::is_same_v<Scalar, bfloat16> ||
                    std::is_same_v<Scalar, float16>,
                "attn::Gradients: Scalar must be float, double, bfloat16 or float16");

 public:
  Gradients() = default;

  /// Zeroed buffers mirroring `parameters` (a module's named_parameters(), any naming).
  /// @throws ConfigError if two parameters have the same name or share memory.
  template <class ListScalar,
            class = std::enable_if_t<std::is_same_v<std::remove_const_t<ListScalar>, Scalar>>>
  explicit Gradients(const ParameterList<ListScalar>& parameters) {
    const std::size_t n = parameters.size();
    entries_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const NamedParameter<const Scalar> p = parameters[i];
      for (const Entry& e : entries_) {
        detail::require_config(e.name != p.name(), "Gradients",
                               [&] { return "parameter name '" + p.name() + "' appears twice"; });
      }
      entries_.push_back(
          {p.name(), p.rank(), p.matrix().shape(), p.matrix().strides(), span_of(p.matrix()), 0});
    }
    owners_ = parameters.owners();
    plan_blocks();
    bind();
  }

  Gradients(const Gradients& other)
      : entries_(other.entries_),
        blocks_(other.blocks_),
        arena_(other.arena_),
        owners_(other.owners_) {
    bind();
  }
  Gradients& operator=(const Gradients& other) {
    if (this != &other) *this = Gradients(other);
    return *this;
  }
  // Moving keeps the arena's heap buffer, so the bound views stay valid.
  Gradients(Gradients&&) noexcept = default;
  Gradients& operator=(Gradients&&) noexcept = default;
  ~Gradients() = default;

  /// Number of parameters.
  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }

  /// Sets every gradient to zero (PyTorch's zero_grad(set_to_none=False)): backward passes
  /// add into the gradients, so call this before each step's backward.
  void zero() noexcept { arena_.fill(Scalar(0)); }

  /// (name, gradient) in the parameters' order; the view has the parameter's shape and
  /// strides and writes into these gradients.
  const NamedParameter<Scalar>& operator[](std::size_t i) const { return items_[i]; }
  auto begin() const noexcept { return items_.begin(); }
  auto end() const noexcept { return items_.end(); }

  /// The gradient called `name`, or nullptr.
  const NamedParameter<Scalar>* find(const std::string& name) const noexcept {
    for (const auto& item : items_) {
      if (item.name() == name) return &item;
    }
    return nullptr;
  }
  /// The gradient called `name`.
  /// @throws IndexError naming `name` and the names there are.
  const NamedParameter<Scalar>& at(const std::string& name) const {
    const NamedParameter<Scalar>* item = find(name);
    if (item == nullptr) {
      std::string known;
      for (const auto& i : items_) known += (known.empty() ? "" : ", ") + i.name();
      throw IndexError("attn::Gradients::at: no parameter '" + name + "' (the parameters are " +
                       (known.empty() ? std::string("none") : known) + ")");
    }
    return *item;
  }
  /// The names, in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& item : items_) out.push_back(item.name());
    return out;
  }

  /// True when the parameters these gradients were made for no longer exist: their module
  /// was destroyed or assigned over (see ParameterList's lifetime). of() then throws.
  bool expired() const noexcept {
    for (const auto& owner : owners_) {
      if (owner.expired()) return true;
    }
    return false;
  }

  /// The gradient of `parameter`, a view into the memory of the parameters these gradients
  /// were made for (a whole parameter, a slice of one, or the block several names share):
  /// a view of the same shape and strides into the gradients.
  /// @throws ConfigError if `parameter` is not inside that memory (a view of another module,
  ///         or of a copy of the module made after these gradients), or that memory no longer
  ///         exists (the module was destroyed or replaced: another one may live there now).
  template <class ViewScalar, std::size_t Rank>
  TensorView<Scalar, Rank> of(TensorView<ViewScalar, Rank> parameter) {
    static_assert(std::is_same_v<std::remove_const_t<ViewScalar>, Scalar>,
                  "attn::Gradients::of: the view must hold the gradients' Scalar");
    detail::require_config(!expired(), "Gradients::of", [] {
      return std::string(
          "the parameters these gradients were made for no longer exist (their module was "
          "destroyed, or replaced by assigning another one to it); make Gradients from the "
          "module's named_parameters() again");
    });
    if (parameter.empty()) return {};
    const Span span = span_of(parameter);
    for (const Block& b : blocks_) {
      if (span.begin >= b.begin && span.end <= b.end) {
        return {arena_.data() + b.offset + (span.begin - b.begin) / sizeof(Scalar),
                parameter.shape(), parameter.strides()};
      }
    }
    throw ConfigError("attn::Gradients::of: a view of shape " +
                      detail::to_string(parameter.shape()) +
                      " is not in the memory of the parameters these gradients were made for "
                      "(make Gradients from this module's named_parameters(), after any copy)");
  }
  template <class ViewScalar, std::size_t Rank>
  TensorView<const Scalar, Rank> of(TensorView<ViewScalar, Rank> parameter) const {
    return const_cast<Gradients&>(*this).of(parameter);
  }

 private:
  // Bytes [begin, end) a view spans in memory (empty views: begin == end == 0).
  struct Span {
    std::uintptr_t begin = 0, end = 0;
  };
  struct Entry {
    std::string name;
    std::size_t rank;
    Shape<2> shape, strides;
    Span span;
    Index offset;  // first element in arena_ (of the mirrored view's data pointer)
  };
  // A run of the parameters' memory mirrored into arena_ from `offset` on.
  struct Block {
    std::uintptr_t begin, end;
    Index offset;
  };

  template <class ViewScalar, std::size_t Rank>
  static Span span_of(const TensorView<ViewScalar, Rank>& v) noexcept {
    if (v.empty()) return {};
    Index last = 0;
    for (std::size_t r = 0; r < Rank; ++r) last += (v.extent(r) - 1) * v.stride(r);
    const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
    return {begin, begin + static_cast<std::uintptr_t>(last + 1) * sizeof(Scalar)};
  }

  // Groups the parameters' spans into blocks of touching memory, gives each block a place in
  // the arena with the same alignment within a cache line as the module's memory (so the
  // GEMMs see gradients aligned like the weights), and allocates the arena.
  void plan_blocks() {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].span.end != 0) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return entries_[a].span.begin < entries_[b].span.begin;
    });
    for (std::size_t k = 0; k < order.size(); ++k) {
      const Entry& e = entries_[order[k]];
      if (k > 0) {
        const Entry& prev = entries_[order[k - 1]];
        detail::require_config(e.span.begin >= prev.span.end, "Gradients", [&] {
          return "parameters '" + prev.name + "' and '" + e.name + "' share memory";
        });
      }
      if (!blocks_.empty() && e.span.begin == blocks_.back().end) {
        blocks_.back().end = e.span.end;
      } else {
        blocks_.push_back({e.span.begin, e.span.end, 0});
      }
    }
    constexpr Index kLine = Index{64} / Index{sizeof(Scalar)};
    Index cursor = 0;
    for (Block& b : blocks_) {
      const auto phase = static_cast<Index>(b.begin % 64) / Index{sizeof(Scalar)};
      b.offset = (cursor + kLine - 1) / kLine * kLine + phase;
      cursor = b.offset + static_cast<Index>((b.end - b.begin) / sizeof(Scalar));
    }
    for (Entry& e : entries_) {
      if (e.span.end == 0) continue;
      for (const Block& b : blocks_) {
        if (e.span.begin >= b.begin && e.span.end <= b.end) {
          e.offset = b.offset + static_cast<Index>((e.span.begin - b.begin) / sizeof(Scalar));
        }
      }
    }
    arena_ = Tensor<Scalar, 1>(Shape<1>{cursor});
  }

  // (Re)builds the named views into arena_ (after construction and copies).
  void bind() {
    items_.clear();
    items_.reserve(entries_.size());
    Scalar* base = arena_.data();
    for (const Entry& e : entries_) {
      const TensorView<Scalar, 2> m(base + e.offset, e.shape, e.strides);
      if (e.rank == 1) {
        items_.emplace_back(e.name, TensorView<Scalar, 1>(m.data(), {e.shape[1]}, {e.strides[1]}));
      } else {
        items_.emplace_back(e.name, m);
      }
    }
  }

  std::vector<Entry> entries_;
  std::vector<Block> blocks_;
  Tensor<Scalar, 1> arena_;
  std::vector<NamedParameter<Scalar>> items_;
  std::vector<std::weak_ptr<const void>> owners_;  // the parameters' lifetimes (ParameterList)
};

ATTN_NAMESPACE_END
