// SPDX-License-Identifier: MIT
// attn/io/state_dict.hpp: load and save attn modules under PyTorch's state_dict names.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attention/causal_attention.hpp"
#include "attn/attention/cross_attention.hpp"
#include "attn/attention/multi_head_attention.hpp"
#include "attn/attention/multi_head_attention_wrapper.hpp"
#include "attn/attention/self_attention.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

namespace attn::io {

/// What load_state_dict() does with tensors under the prefix that the module has no
/// parameter for (PyTorch's `strict`). Missing or mis-shaped tensors are always errors.
enum class Strict {
  kNo,   ///< ignore them (default)
  kYes,  ///< throw StateDictError listing them
};

/// Which names save_state_dict() writes for a MultiHeadAttention.
enum class StateDictNames {
  /// torch.nn.MultiheadAttention: in_proj_weight, in_proj_bias (or q/k/v_proj_weight when
  /// kdim/vdim differ), out_proj.weight, out_proj.bias.
  kMultiheadAttention,
  /// The notebooks' MultiHeadAttention: W_query.weight, W_key.weight, W_value.weight (+
  /// .bias), out_proj.weight (+ .bias), and the `mask` buffer when the module is causal with
  /// a context_length.
  kNotebook,
};

namespace detail {

/// One parameter to fill: its full name, a destination view, and whether the file stores
/// it transposed (the raw (d_in, d_out) parameters of notebook 003's SelfAttention_v1).
template <class Scalar>
struct Binding {
  std::string name;
  TensorView<Scalar, 2> matrix{};
  TensorView<Scalar, 1> vector{};
  bool transposed = false;
  bool is_matrix = true;
};

/// Collects a module's parameters, validates every tensor before writing any (a failed
/// load leaves the module unchanged), then copies them in.
template <class Scalar>
class StateDictLoader {
 public:
  StateDictLoader(const SafetensorsFile& file, std::string prefix, const char* module)
      : file_(file), prefix_(std::move(prefix)), module_(module) {}

  bool has(const std::string& name) const { return file_.contains(prefix_ + name); }

  void matrix(const std::string& name, TensorView<Scalar, 2> dst, bool transposed = false) {
    bindings_.push_back({prefix_ + name, dst, {}, transposed, true});
  }
  void vector(const std::string& name, TensorView<Scalar, 1> dst) {
    bindings_.push_back({prefix_ + name, {}, dst, false, false});
  }
  /// A bias: required when the module has one; an error when the file has one and the
  /// module does not (dropping it would silently change the results).
  void bias(const std::string& name, TensorView<Scalar, 1> dst) {
    if (dst.data() != nullptr) {
      vector(name, dst);
      return;
    }
    io_require<StateDictError>(!has(name), where(), [&] {
      return "'" + file_.source() + "' has '" + prefix_ + name +
             "' but this module was built without that bias";
    });
  }
  /// A tensor that is accepted and ignored (the notebooks' `mask` buffer).
  void ignore(const std::string& name) {
    if (has(name)) consumed_.insert(prefix_ + name);
  }
  /// A tensor the module cannot represent: an error if present.
  void unsupported(const std::string& name, const char* why) {
    io_require<StateDictError>(!has(name), where(), [&] {
      return "'" + file_.source() + "' has '" + prefix_ + name + "': " + why;
    });
  }

  /// Validates all bindings, copies them in, then applies the strictness check.
  void finish(Strict strict) {
    std::vector<std::function<void()>> writes;
    for (const Binding<Scalar>& b : bindings_) {
      io_require<StateDictError>(file_.contains(b.name), where(), [&] {
        return "'" + file_.source() + "' has no tensor '" + b.name + "'" + listing();
      });
      const std::vector<Index>& shape = file_.shape(b.name);
      std::vector<Index> expected;
      if (b.is_matrix) {
        expected = b.transposed ? std::vector<Index>{b.matrix.extent(1), b.matrix.extent(0)}
                                : std::vector<Index>{b.matrix.extent(0), b.matrix.extent(1)};
      } else {
        expected = {b.vector.extent(0)};
      }
      io_require<StateDictError>(shape == expected, where(), [&] {
        return "'" + file_.source() + "': tensor '" + b.name + "' has shape " +
               shape_text(shape) + ", expected " + shape_text(expected);
      });
      consumed_.insert(b.name);
      if (expected.size() == 2) {
        auto value = std::make_shared<Tensor<Scalar, 2>>(file_.get<Scalar, 2>(b.name));
        writes.push_back([value, b] {
          const TensorView<const Scalar, 2> source = value->view();
          copy(b.transposed ? transpose(source) : source, b.matrix);
        });
      } else {
        auto value = std::make_shared<Tensor<Scalar, 1>>(file_.get<Scalar, 1>(b.name));
        writes.push_back([value, b] { copy(TensorView<const Scalar, 1>(value->view()), b.vector); });
      }
    }
    if (strict == Strict::kYes) {
      std::string unexpected;
      for (const std::string& name : file_.names()) {
        if (name.compare(0, prefix_.size(), prefix_) == 0 && consumed_.count(name) == 0) {
          unexpected += (unexpected.empty() ? "" : ", ") + ("'" + name + "'");
        }
      }
      io_require<StateDictError>(unexpected.empty(), where(), [&] {
        return "'" + file_.source() + "' has unexpected tensor(s) " + unexpected +
               (prefix_.empty() ? std::string() : " under prefix '" + prefix_ + "'") +
               " (strict mode)";
      });
    }
    for (const auto& write : writes) write();
  }

  const std::string& prefix() const noexcept { return prefix_; }

 private:
  const char* where() const noexcept { return module_; }
  std::string listing() const {
    std::string text;
    std::size_t n = 0;
    for (const std::string& name : file_.names()) {
      if (name.compare(0, prefix_.size(), prefix_) != 0) continue;
      text += (n == 0 ? "; tensors under prefix '" + prefix_ + "': " : ", ") + name;
      if (++n == 10) {
        text += ", ...";
        break;
      }
    }
    return n == 0 ? "; no tensor starts with prefix '" + prefix_ + "'" : text;
  }

  const SafetensorsFile& file_;
  std::string prefix_;
  const char* module_;
  std::vector<Binding<Scalar>> bindings_;
  std::set<std::string> consumed_;
};

/// Adds W_query/W_key/W_value (+ bias) of a SelfAttention-like module, accepting the
/// nn.Linear form (`W_query.weight`, (d_out, d_in)) or the raw parameter form of notebook
/// 003's SelfAttention_v1 (`W_query`, (d_in, d_out), applied as x @ W).
template <class Scalar, class Layer>
void bind_projection(StateDictLoader<Scalar>& loader, const std::string& name, Layer&& layer) {
  if (!loader.has(name + ".weight") && loader.has(name)) {
    loader.matrix(name, layer.weight(), /*transposed=*/true);
    loader.bias(name + ".bias", layer.bias());
    return;
  }
  loader.matrix(name + ".weight", layer.weight());
  loader.bias(name + ".bias", layer.bias());
}

template <class Scalar>
void bind_self_attention(StateDictLoader<Scalar>& loader, SelfAttention<Scalar>& module) {
  bind_projection(loader, "W_query", module.w_query());
  bind_projection(loader, "W_key", module.w_key());
  bind_projection(loader, "W_value", module.w_value());
}

template <class Scalar>
Tensor<Scalar, 2> causal_buffer(Index n) {
  Tensor<Scalar, 2> mask({n, n});
  for (Index i = 0; i < n; ++i) {
    for (Index j = i + 1; j < n; ++j) mask(i, j) = Scalar(1);
  }
  return mask;
}

template <class Scalar, class LinearLike>
void save_linear(SafetensorsWriter& out, const std::string& name, const LinearLike& layer) {
  out.add(name + ".weight", TensorView<const Scalar, 2>(layer.weight()));
  if (layer.has_bias()) out.add(name + ".bias", TensorView<const Scalar, 1>(layer.bias()));
}

}  // namespace detail

// ---- MultiHeadAttention ----

/// Loads a MultiHeadAttention from a state_dict saved as safetensors, by PyTorch's names,
/// each prefixed with `prefix` (e.g. "encoder.layers.0.self_attn."). Two layouts are
/// recognised by their names:
/// - torch.nn.MultiheadAttention: `in_proj_weight` (3 E, E) and `in_proj_bias` (3 E), or
///   `q_proj_weight` (E, E), `k_proj_weight` (E, kdim), `v_proj_weight` (E, vdim) when
///   kdim/vdim differ; `out_proj.weight` (E, E), `out_proj.bias` (E);
/// - the notebooks' MultiHeadAttention: `W_query.weight`, `W_key.weight`, `W_value.weight`
///   (+ `.bias` with qkv_bias), `out_proj.weight` (+ `.bias`); a `mask` buffer is ignored.
/// The module must already have the file's configuration (sizes, bias presence): build it
/// with MultiHeadAttentionOptions::pytorch(embed_dim, num_heads, bias, kdim, vdim), or see
/// options_from_state_dict(). Values are converted to Scalar (F16, BF16, F32, F64).
///
/// @throws StateDictError naming the tensor if one is missing, has the wrong shape, is a
///         bias the module lacks, or is `bias_k`/`bias_v` (add_bias_kv is not supported);
///         with Strict::kYes also if a tensor under the prefix is not used. On any error
///         the module is left unchanged. FormatError if a tensor cannot be converted.
template <class Scalar>
void load_state_dict(MultiHeadAttention<Scalar>& module, const SafetensorsFile& file,
                     const std::string& prefix = "", Strict strict = Strict::kNo) {
  detail::StateDictLoader<Scalar> loader(file, prefix, "load_state_dict(MultiHeadAttention)");
  loader.unsupported("bias_k", "add_bias_kv=True is not supported by attn::MultiHeadAttention");
  loader.unsupported("bias_v", "add_bias_kv=True is not supported by attn::MultiHeadAttention");
  if (loader.has("W_query.weight") || loader.has("W_query")) {
    detail::bind_projection(loader, "W_query", module.w_query());
    detail::bind_projection(loader, "W_key", module.w_key());
    detail::bind_projection(loader, "W_value", module.w_value());
    loader.ignore("mask");
  } else {
    if (module.qkv_same_embed_dim() && !loader.has("q_proj_weight")) {
      loader.matrix("in_proj_weight", module.in_proj_weight());
    } else {
      loader.matrix("q_proj_weight", module.q_proj_weight());
      loader.matrix("k_proj_weight", module.k_proj_weight());
      loader.matrix("v_proj_weight", module.v_proj_weight());
      if (!module.qkv_same_embed_dim()) {
        loader.unsupported("in_proj_weight",
                           "the module has kdim/vdim != embed_dim, so it expects "
                           "q_proj_weight, k_proj_weight and v_proj_weight");
      }
    }
    loader.bias("in_proj_bias", module.in_proj_bias());
  }
  loader.matrix("out_proj.weight", module.out_proj().weight());
  loader.bias("out_proj.bias", module.out_proj().bias());
  loader.finish(strict);
}

/// Adds a MultiHeadAttention's parameters to `out` under PyTorch's names (see
/// StateDictNames), each prefixed with `prefix`.
template <class Scalar>
void save_state_dict(const MultiHeadAttention<Scalar>& module, SafetensorsWriter& out,
                     const std::string& prefix = "",
                     StateDictNames names = StateDictNames::kMultiheadAttention) {
  if (names == StateDictNames::kMultiheadAttention) {
    if (module.qkv_same_embed_dim()) {
      out.add(prefix + "in_proj_weight", module.in_proj_weight());
    } else {
      out.add(prefix + "q_proj_weight", module.q_proj_weight());
      out.add(prefix + "k_proj_weight", module.k_proj_weight());
      out.add(prefix + "v_proj_weight", module.v_proj_weight());
    }
    if (module.has_qkv_bias()) out.add(prefix + "in_proj_bias", module.in_proj_bias());
  } else {
    detail::save_linear<Scalar>(out, prefix + "W_query", module.w_query());
    detail::save_linear<Scalar>(out, prefix + "W_key", module.w_key());
    detail::save_linear<Scalar>(out, prefix + "W_value", module.w_value());
    if (module.is_causal() && module.context_length() > 0) {
      out.add(prefix + "mask", detail::causal_buffer<Scalar>(module.context_length()));
    }
  }
  detail::save_linear<Scalar>(out, prefix + "out_proj", module.out_proj());
}

/// The MultiHeadAttentionOptions of the torch.nn.MultiheadAttention (or notebook
/// MultiHeadAttention) whose state_dict `file` holds under `prefix`: embed_dim (d_in,
/// d_out), kdim, vdim and bias presence come from the tensors' shapes; num_heads is not
/// stored in a state_dict and must be given.
/// @throws StateDictError if no known layout is found or the shapes are inconsistent.
inline MultiHeadAttentionOptions options_from_state_dict(const SafetensorsFile& file,
                                                         Index num_heads,
                                                         const std::string& prefix = "") {
  const char* where = "options_from_state_dict";
  const auto has = [&](const std::string& name) { return file.contains(prefix + name); };
  const auto matrix_shape = [&](const std::string& name) {
    const std::vector<Index>& s = file.shape(prefix + name);
    detail::io_require<StateDictError>(s.size() == 2, where, [&] {
      return "'" + file.source() + "': tensor '" + prefix + name + "' has shape " +
             detail::shape_text(s) + ", expected a matrix";
    });
    return s;
  };
  MultiHeadAttentionOptions o;
  o.num_heads = num_heads;
  if (has("W_query.weight")) {
    const auto q = matrix_shape("W_query.weight");
    o.d_out = q[0];
    o.d_in = q[1];
    o.kdim = has("W_key.weight") ? matrix_shape("W_key.weight")[1] : q[1];
    o.vdim = has("W_value.weight") ? matrix_shape("W_value.weight")[1] : q[1];
    o.qkv_bias = has("W_query.bias");
    o.out_bias = has("out_proj.bias");
    o.init = InitScheme::kLinear;
    return o;
  }
  if (has("in_proj_weight")) {
    const auto w = matrix_shape("in_proj_weight");
    detail::io_require<StateDictError>(w[0] % 3 == 0 && w[0] / 3 == w[1], where, [&] {
      return "'" + file.source() + "': in_proj_weight has shape " + detail::shape_text(w) +
             ", expected (3 E, E)";
    });
    o.d_in = o.d_out = w[1];
  } else if (has("q_proj_weight")) {
    const auto q = matrix_shape("q_proj_weight");
    o.d_in = q[1];
    o.d_out = q[0];
    o.kdim = has("k_proj_weight") ? matrix_shape("k_proj_weight")[1] : 0;
    o.vdim = has("v_proj_weight") ? matrix_shape("v_proj_weight")[1] : 0;
  } else {
    detail::io_require<StateDictError>(false, where, [&] {
      return "'" + file.source() + "' has none of '" + prefix + "in_proj_weight', '" + prefix +
             "q_proj_weight' or '" + prefix + "W_query.weight' (is the prefix right?)";
    });
  }
  o.qkv_bias = has("in_proj_bias");
  o.out_bias = has("out_proj.bias");
  o.init = InitScheme::kMultiheadAttention;
  return o;
}

// ---- CrossAttention ----

/// Loads a CrossAttention's module by the names of load_state_dict(MultiHeadAttention&).
template <class Scalar>
void load_state_dict(CrossAttention<Scalar>& module, const SafetensorsFile& file,
                     const std::string& prefix = "", Strict strict = Strict::kNo) {
  load_state_dict(module.module(), file, prefix, strict);
}

template <class Scalar>
void save_state_dict(const CrossAttention<Scalar>& module, SafetensorsWriter& out,
                     const std::string& prefix = "",
                     StateDictNames names = StateDictNames::kMultiheadAttention) {
  save_state_dict(module.module(), out, prefix, names);
}

// ---- SelfAttention, CausalAttention, MultiHeadAttentionWrapper (notebook names) ----

/// Loads SelfAttention_v2 / SingleHeadAttention's `W_query.weight`, `W_key.weight`,
/// `W_value.weight` (+ `.bias`), or SelfAttention_v1's raw `W_query`, `W_key`, `W_value`
/// (d_in, d_out).
/// @throws as load_state_dict(MultiHeadAttention&).
template <class Scalar>
void load_state_dict(SelfAttention<Scalar>& module, const SafetensorsFile& file,
                     const std::string& prefix = "", Strict strict = Strict::kNo) {
  detail::StateDictLoader<Scalar> loader(file, prefix, "load_state_dict(SelfAttention)");
  detail::bind_self_attention(loader, module);
  loader.finish(strict);
}

/// Loads CausalAttention's W_query/W_key/W_value (+ bias); its `mask` buffer is ignored
/// (the causal bound is structural in attn).
template <class Scalar>
void load_state_dict(CausalAttention<Scalar>& module, const SafetensorsFile& file,
                     const std::string& prefix = "", Strict strict = Strict::kNo) {
  detail::StateDictLoader<Scalar> loader(file, prefix, "load_state_dict(CausalAttention)");
  detail::bind_self_attention<Scalar>(loader, module);
  loader.ignore("mask");
  loader.finish(strict);
}

/// Loads every head: `heads.<h>.W_query.weight`, ... (+ `heads.<h>.mask`, ignored).
template <class Scalar>
void load_state_dict(MultiHeadAttentionWrapper<Scalar>& module, const SafetensorsFile& file,
                     const std::string& prefix = "", Strict strict = Strict::kNo) {
  detail::StateDictLoader<Scalar> loader(file, prefix,
                                         "load_state_dict(MultiHeadAttentionWrapper)");
  for (Index h = 0; h < module.num_heads(); ++h) {
    const std::string head = "heads." + std::to_string(h) + ".";
    SelfAttention<Scalar>& m = module.head(h);
    detail::bind_projection(loader, head + "W_query", m.w_query());
    detail::bind_projection(loader, head + "W_key", m.w_key());
    detail::bind_projection(loader, head + "W_value", m.w_value());
    loader.ignore(head + "mask");
  }
  loader.finish(strict);
}

template <class Scalar>
void save_state_dict(const SelfAttention<Scalar>& module, SafetensorsWriter& out,
                     const std::string& prefix = "") {
  detail::save_linear<Scalar>(out, prefix + "W_query", module.w_query());
  detail::save_linear<Scalar>(out, prefix + "W_key", module.w_key());
  detail::save_linear<Scalar>(out, prefix + "W_value", module.w_value());
}

/// Writes W_query/W_key/W_value (+ bias) and the `mask` buffer (triu of ones, diagonal 1,
/// context_length square), so PyTorch's strict load_state_dict accepts the file.
template <class Scalar>
void save_state_dict(const CausalAttention<Scalar>& module, SafetensorsWriter& out,
                     const std::string& prefix = "") {
  save_state_dict(static_cast<const SelfAttention<Scalar>&>(module), out, prefix);
  out.add(prefix + "mask", detail::causal_buffer<Scalar>(module.context_length()));
}

template <class Scalar>
void save_state_dict(const MultiHeadAttentionWrapper<Scalar>& module, SafetensorsWriter& out,
                     const std::string& prefix = "") {
  for (Index h = 0; h < module.num_heads(); ++h) {
    save_state_dict(module.head(h), out, prefix + "heads." + std::to_string(h) + ".");
  }
}

// ---- whole files ----

/// Opens `path` (memory-mapped) and loads `module` from it.
template <class Module>
void load_state_dict(Module& module, const std::string& path, const std::string& prefix = "",
                     Strict strict = Strict::kNo) {
  load_state_dict(module, SafetensorsFile::open(path), prefix, strict);
}

/// Writes `module`'s state_dict to the safetensors file `path`.
template <class Module, class... Names>
void save_state_dict(const Module& module, const std::string& path, Names... names) {
  SafetensorsWriter out;
  save_state_dict(module, out, "", names...);
  out.save(path);
}

}  // namespace attn::io
