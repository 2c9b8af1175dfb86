// SPDX-License-Identifier: MIT
// attn/nn/parameter.hpp: a module's parameters by name (named_parameters()), the list that
// loading, saving and (later) gradients and optimizers walk.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// Which names a module gives its parameters: the state_dict keys of the PyTorch class it
/// stands for. Every module has its own default; the others are the layouts PyTorch and the
/// notebooks use for the same weights.
enum class ParameterNames {
  /// The module's own: SelfAttention / CausalAttention / MultiHeadAttentionWrapper as the
  /// notebook class they were built as; MultiHeadAttention and CrossAttention as
  /// torch.nn.MultiheadAttention.
  kDefault,
  /// torch.nn.MultiheadAttention: in_proj_weight (3 E, E), or q_proj_weight, k_proj_weight,
  /// v_proj_weight when kdim/vdim differ from E; in_proj_bias; out_proj.weight, out_proj.bias.
  kMultiheadAttention,
  /// q_proj_weight, k_proj_weight, v_proj_weight whatever the dims (PyTorch's kdim/vdim
  /// layout), in_proj_bias, out_proj.weight, out_proj.bias.
  kSeparateProjections,
  /// The notebooks' nn.Linear projections: W_query.weight, W_key.weight, W_value.weight
  /// (+ .bias), out_proj.weight (+ .bias), and the `mask` buffer of causal modules.
  kNotebook,
  /// Notebook 003's SelfAttention_v1: raw W_query, W_key, W_value parameters of shape
  /// (d_in, d_out), applied as x @ W (the transposes of the nn.Linear weights).
  kNotebookRaw,
  /// Hugging Face's Llama / Mistral / Qwen2 attention (`self_attn.`): q_proj.weight
  /// (H hd, d_in), k_proj.weight and v_proj.weight (H_kv hd, d_in), o_proj.weight (d_out,
  /// H hd), and q_proj.bias, k_proj.bias, v_proj.bias, o_proj.bias when the module has them.
  kLlama,
};

/// One parameter: its name and a view of its values (rank 1 or 2). The view may be strided
/// (a raw (d_in, d_out) parameter is the transpose of the stored weight) and writes go
/// straight into the module.
///
/// @tparam Scalar float or double, optionally const (a const module's parameters).
template <class Scalar>
class NamedParameter {
 public:
  NamedParameter(std::string name, TensorView<Scalar, 2> matrix)
      : name_(std::move(name)), matrix_(matrix), rank_(2) {}
  NamedParameter(std::string name, TensorView<Scalar, 1> vector)
      : name_(std::move(name)),
        matrix_(vector.data(), {1, vector.extent(0)}, {0, vector.stride(0)}),
        rank_(1) {}
  /// Mutable -> const.
  template <class Other, class = std::enable_if_t<std::is_same_v<const Other, Scalar>>>
  NamedParameter(const NamedParameter<Other>& other)  // NOLINT: implicit like the views
      : name_(other.name()), matrix_(other.matrix()), rank_(other.rank()) {}

  const std::string& name() const noexcept { return name_; }
  std::size_t rank() const noexcept { return rank_; }
  /// (rows, cols) for a matrix, (n) for a vector.
  std::vector<Index> shape() const {
    if (rank_ == 1) return {matrix_.extent(1)};
    return {matrix_.extent(0), matrix_.extent(1)};
  }
  Index size() const noexcept { return matrix_.size(); }
  /// The values as a matrix; a vector is (1, n).
  TensorView<Scalar, 2> matrix() const noexcept { return matrix_; }
  /// The values of a rank-1 parameter. @throws ShapeError for a matrix.
  TensorView<Scalar, 1> vector() const {
    detail::require(rank_ == 1, "NamedParameter::vector", [&] {
      return "'" + name_ + "' has shape " + detail::to_string(matrix_.shape()) + ", not a vector";
    });
    return {matrix_.data(), {matrix_.extent(1)}, {matrix_.stride(1)}};
  }

 private:
  std::string name_;
  TensorView<Scalar, 2> matrix_;
  std::size_t rank_;
};

/// A name a module's configuration leaves out, and why (" but this module was built without
/// that bias", ": add_bias_kv=True is not supported ...").
struct AbsentParameter {
  std::string name, reason;
};

/// A module's named_parameters(): (name, view) in state_dict order. It also records the
/// names the module's configuration leaves out (a bias built with bias=false) and why, so
/// that a loader can say why a file's tensor does not fit.
///
/// Lifetime. The views point into the module; they stay valid while the module lives, also
/// when it is moved (its heap memory moves with it), and become dangling when it is destroyed
/// or assigned over (`module = Module(...)`). A module's list watches a token of the module
/// that expires then (watch()); what keeps a list beyond a call (an optimizer, Gradients)
/// checks expired() before it touches the views. A list built by hand from tensors of one's
/// own watches nothing: keeping them alive is the caller's part.
///
/// @tparam Scalar float or double, optionally const.
template <class Scalar>
class ParameterList {
 public:
  using value_type = NamedParameter<Scalar>;
  using element_type = Scalar;
  using Absent = AbsentParameter;

  ParameterList() = default;
  template <class Other, class = std::enable_if_t<std::is_same_v<const Other, Scalar>>>
  ParameterList(const ParameterList<Other>& other)  // NOLINT: mutable -> const
      : items_(other.begin(), other.end()), absent_(other.absent()), owners_(other.owners()) {}

  /// Adds a parameter; an empty view (a bias the module lacks) adds `name` as absent.
  template <std::size_t Rank>
  ParameterList& add(std::string name, TensorView<Scalar, Rank> view) {
    if (view.data() == nullptr) {
      return absent(std::move(name), " but this module was built without that bias");
    }
    items_.emplace_back(std::move(name), view);
    return *this;
  }
  ParameterList& absent(std::string name, std::string reason) {
    absent_.push_back({std::move(name), std::move(reason)});
    return *this;
  }
  /// Appends `other` with every name prefixed (a submodule: "heads.0.", "out_proj.").
  ParameterList& append(const std::string& prefix, const ParameterList& other) {
    for (const auto& p : other) {
      items_.push_back(p.rank() == 1 ? NamedParameter<Scalar>(prefix + p.name(), p.vector())
                                     : NamedParameter<Scalar>(prefix + p.name(), p.matrix()));
    }
    for (const auto& a : other.absent()) absent_.push_back({prefix + a.name, a.reason});
    owners_.insert(owners_.end(), other.owners_.begin(), other.owners_.end());
    return *this;
  }

  /// Watches `lifetime`, a token that expires when the memory of (some of) the views is freed
  /// (a module adds its own; see the class comment).
  ParameterList& watch(std::weak_ptr<const void> lifetime) {
    owners_.push_back(std::move(lifetime));
    return *this;
  }
  /// True when a watched token expired: some views may point into freed memory.
  bool expired() const noexcept {
    for (const auto& owner : owners_) {
      if (owner.expired()) return true;
    }
    return false;
  }
  /// The tokens watched.
  const std::vector<std::weak_ptr<const void>>& owners() const noexcept { return owners_; }

  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }
  const NamedParameter<Scalar>& operator[](std::size_t i) const { return items_[i]; }
  auto begin() const noexcept { return items_.begin(); }
  auto end() const noexcept { return items_.end(); }
  const std::vector<Absent>& absent() const noexcept { return absent_; }

  /// The parameter called `name`, or nullptr.
  const NamedParameter<Scalar>* find(const std::string& name) const noexcept {
    for (const auto& p : items_) {
      if (p.name() == name) return &p;
    }
    return nullptr;
  }
  /// The names, in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& p : items_) out.push_back(p.name());
    return out;
  }

 private:
  std::vector<NamedParameter<Scalar>> items_;
  std::vector<Absent> absent_;
  std::vector<std::weak_ptr<const void>> owners_;
};

/// A buffer of a module's state_dict that is not a parameter: derived from the
/// configuration (the notebooks' causal `mask`), written when saving, accepted when loading.
template <class Scalar>
struct NamedBuffer {
  std::string name;
  Tensor<Scalar, 2> value;
};

ATTN_NAMESPACE_END
