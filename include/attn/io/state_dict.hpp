// SPDX-License-Identifier: MIT
// attn/io/state_dict.hpp: load and save any attn module under its state_dict names, through
// the module's named_parameters() and named_buffers().
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attn/attention/module_core.hpp"
#include "attn/attention/multi_head_attention.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// Whether load_state_dict() demands that the file and the module have the same names
/// (PyTorch's `strict`).
enum class Strict {
  /// Missing and unexpected names are returned in the LoadResult; the rest is loaded.
  kNo,
  /// Missing or unexpected names are a StateDictError listing every one (the default).
  kYes,
};

/// Which names save_state_dict() writes (kDefault: the module's own). See ParameterNames.
using StateDictNames = ParameterNames;

/// The names load_state_dict() could not match, with the prefix: PyTorch's missing_keys
/// (module parameters the file lacks; they keep their values) and unexpected_keys (tensors
/// under the prefix the module has no parameter or buffer for). Empty after a strict load.
struct LoadResult {
  std::vector<std::string> missing, unexpected;
};

namespace detail {

inline bool is_floating(DType dtype) noexcept {
  return dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF32 ||
         dtype == DType::kF64;
}

inline bool has_prefix(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}

/// "; tensors under prefix 'p': a, b, ..." (at most 10), or "; no tensor starts with ...".
inline std::string listing(const SafetensorsFile& file, const std::string& prefix) {
  std::string text;
  std::size_t n = 0;
  for (const std::string& name : file.names()) {
    if (!has_prefix(name, prefix)) continue;
    text += (n == 0 ? "; tensors under prefix '" + prefix + "': " : ", ") + name;
    if (++n == 10) {
      text += ", ...";
      break;
    }
  }
  return n == 0 ? "; no tensor starts with prefix '" + prefix + "'" : text;
}

inline std::string quoted_list(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "'" : ", '") + name + "'";
  return text;
}

/// Of the namings a module accepts, the one with the most of its parameter names in the
/// file (the module's default on a tie).
template <class Module>
ParameterNames naming_in(const Module& module, const SafetensorsFile& file,
                         const std::string& prefix) {
  ParameterNames best = ParameterNames::kDefault;
  std::size_t best_count = 0;
  bool first = true;
  for (const ParameterNames names : module.parameter_namings()) {
    std::size_t count = 0;
    for (const auto& p : module.named_parameters(names)) count += file.contains(prefix + p.name());
    if (first || count > best_count) {
      best = names;
      best_count = count;
      first = false;
    }
  }
  return best;
}

}  // namespace detail

/// Loads a module's parameters from a state_dict saved as safetensors, each name prefixed
/// with `prefix` (e.g. "encoder.layers.0.self_attn."). The names are the module's
/// named_parameters() under the naming the file uses (see ParameterNames): for a
/// MultiHeadAttention, torch.nn.MultiheadAttention's (`in_proj_weight`, `in_proj_bias` or
/// `q/k/v_proj_weight`, `out_proj.weight`, `out_proj.bias`) or the notebooks'
/// (`W_query.weight`, ...); for SelfAttention, `W_query.weight`, ... or SelfAttention_v1's
/// raw `W_query` (d_in, d_out); for the wrapper `heads.<h>.W_query.weight`, .... Buffers the
/// module derives (the notebooks' causal `mask`) are accepted when their shape fits and
/// need not be present. Values are converted to Scalar from F16, BF16, F32 or F64: widened
/// exactly into a float or double module; into a bfloat16 module BF16 tensors are copied
/// bit for bit (never through float) and F16, F32 and F64 ones rounded once, to nearest
/// even (SafetensorsFile::get); into a float16 module F16 ones are copied bit for bit and
/// BF16, F32 and F64 ones rounded once.
///
/// The module must already have the file's configuration (sizes, bias presence): build a
/// MultiHeadAttention with MultiHeadAttentionOptions::pytorch(embed_dim, num_heads, bias,
/// kdim, vdim), or see options_from_state_dict(). Loading unfreezes the module.
///
/// @returns the missing and unexpected names (empty unless strict is Strict::kNo).
/// @throws StateDictError naming the tensor if one has the wrong shape or a non-floating
///         dtype (integer or bool parameters are refused); with Strict::kYes (the default)
///         also listing every missing and every unexpected name (a bias the module was built
///         without, `bias_k`/`bias_v`, anything else under the prefix). On any error the
///         module is left unchanged. FormatError if a tensor cannot be read.
template <class Module>
LoadResult load_state_dict(Module& module, const SafetensorsFile& file,
                           const std::string& prefix = "", Strict strict = Strict::kYes) {
  const char* where = "load_state_dict";
  const ParameterNames names = detail::naming_in(std::as_const(module), file, prefix);
  const auto params = module.named_parameters(names);
  using Element = typename decltype(params)::element_type;
  LoadResult result;
  std::set<std::string> known;
  // Pass 1: check and read every tensor the module has a parameter for.
  const auto checked_shape = [&](const std::string& name, const std::vector<Index>& expected) {
    detail::io_require<StateDictError>(detail::is_floating(file.dtype(name)), where, [&] {
      return "'" + file.source() + "': tensor '" + name + "' has dtype " +
             dtype_name(file.dtype(name)) +
             "; parameters are floating point (F16, BF16, F32 or F64)";
    });
    detail::io_require<StateDictError>(file.shape(name) == expected, where, [&] {
      return "'" + file.source() + "': tensor '" + name + "' has shape " +
             detail::shape_text(file.shape(name)) + ", expected " + detail::shape_text(expected);
    });
  };
  std::vector<std::pair<TensorView<Element, 2>, Tensor<Element, 2>>> values;
  for (const auto& p : params) {
    const std::string name = prefix + p.name();
    known.insert(name);
    if (!file.contains(name)) {
      result.missing.push_back(name);
      continue;
    }
    checked_shape(name, p.shape());
    if (p.rank() == 1) {
      values.emplace_back(p.matrix(), unsqueeze(file.get<Element, 1>(name).view(), 0));
    } else {
      values.emplace_back(p.matrix(), file.get<Element, 2>(name));
    }
  }
  for (const auto& buffer : module.named_buffers(names)) {
    const std::string name = prefix + buffer.name;
    known.insert(name);
    if (file.contains(name)) {
      checked_shape(name,
                    std::vector<Index>(buffer.value.shape().begin(), buffer.value.shape().end()));
    }
  }
  // Pass 2: what the file has that the module does not (with the reason, where known).
  std::string unexpected_reasons;
  for (const std::string& name : file.names()) {
    if (!detail::has_prefix(name, prefix) || known.count(name) != 0) continue;
    result.unexpected.push_back(name);
    for (const auto& absent : params.absent()) {
      if (prefix + absent.name == name) {
        unexpected_reasons += "; '" + file.source() + "' has '" + name + "'" + absent.reason;
      }
    }
  }
  if (strict == Strict::kYes) {
    std::string problems;
    if (!result.missing.empty()) {
      problems += "'" + file.source() + "' has no tensor" +
                  (result.missing.size() > 1 ? "s " : " ") + detail::quoted_list(result.missing) +
                  detail::listing(file, prefix);
    }
    if (!result.unexpected.empty()) {
      problems += std::string(problems.empty() ? "" : "; ") + "'" + file.source() +
                  "' has unexpected tensor(s) " + detail::quoted_list(result.unexpected) +
                  (prefix.empty() ? std::string() : " under prefix '" + prefix + "'") +
                  " (strict mode)" + unexpected_reasons;
    }
    detail::io_require<StateDictError>(problems.empty(), where, [&] { return problems; });
  }
  // Pass 3: write (nothing is written unless every check passed).
  for (const auto& [destination, value] : values) {
    copy(TensorView<const Element, 2>(value.view()), destination);
  }
  return result;
}

/// Opens `path` (memory-mapped) and loads `module` from it.
template <class Module>
LoadResult load_state_dict(Module& module, const std::string& path, const std::string& prefix = "",
                           Strict strict = Strict::kYes) {
  return load_state_dict(module, SafetensorsFile::open(path), prefix, strict);
}

/// Adds a module's parameters and buffers to `out` under the names of `names` (kDefault:
/// the module's own; see ParameterNames), each prefixed with `prefix`, in the module's type:
/// F32 for float, F64 for double, BF16 for bfloat16 and F16 for float16 (the weights' bits,
/// which load back bit
/// for bit). The notebooks' causal modules also write their `mask` buffer, so PyTorch's
/// strict load_state_dict accepts the file.
template <class Module>
void save_state_dict(const Module& module, SafetensorsWriter& out, const std::string& prefix = "",
                     StateDictNames names = StateDictNames::kDefault) {
  for (const auto& p : module.named_parameters(names)) {
    if (p.rank() == 1) {
      out.add(prefix + p.name(), p.vector());
    } else {
      out.add(prefix + p.name(), p.matrix());
    }
  }
  for (const auto& buffer : module.named_buffers(names))
    out.add(prefix + buffer.name, buffer.value);
}

/// Writes `module`'s state_dict to the safetensors file `path`.
template <class Module>
void save_state_dict(const Module& module, const std::string& path,
                     StateDictNames names = StateDictNames::kDefault) {
  SafetensorsWriter out;
  save_state_dict(module, out, "", names);
  out.save(path);
}

/// The MultiHeadAttentionOptions of the torch.nn.MultiheadAttention (or notebook
/// MultiHeadAttention, or Hugging Face Llama / Mistral / Qwen2 attention) whose state_dict
/// `file` holds under `prefix`: embed_dim (d_in, d_out), kdim, vdim and bias presence come
/// from the tensors' shapes; num_heads is not stored in a state_dict and must be given. With
/// Llama's names (q_proj.weight, ...) head_dim is q_proj's rows / num_heads, num_kv_heads
/// k_proj's rows / head_dim and value_head_dim v_proj's rows / num_kv_heads. A `sinks` tensor
/// (gpt-oss) sets sinks (its length must be num_heads).
/// @throws StateDictError if no known layout is found or the shapes are inconsistent.
inline MultiHeadAttentionOptions options_from_state_dict(const SafetensorsFile& file,
                                                         Index num_heads,
                                                         const std::string& prefix = "") {
  using Names = attn::detail::AttentionCore<float>;
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
  const auto notebook = [](int part, const char* what) {
    return std::string(Names::notebook_name(part)) + what;
  };
  const std::string out_bias = std::string(Names::kOutProj) + "bias";
  MultiHeadAttentionOptions o;
  o.num_heads = num_heads;
  // gpt-oss's learned sinks, one per query head.
  if (has(Names::kSinks)) {
    const std::vector<Index>& s = file.shape(prefix + Names::kSinks);
    detail::io_require<StateDictError>(s == std::vector<Index>{num_heads}, where, [&] {
      return "'" + file.source() + "': tensor '" + prefix + Names::kSinks + "' has shape " +
             detail::shape_text(s) + ", expected [" + std::to_string(num_heads) +
             "] (one per head, num_heads=" + std::to_string(num_heads) + ")";
    });
    o.sinks = true;
  }
  const auto llama = [](int part, const char* what) {
    return std::string(Names::llama_name(part)) + what;
  };
  if (has(llama(0, ".weight"))) {
    const auto q = matrix_shape(llama(0, ".weight"));
    // The key/value heads and kdim are read from k_proj.weight: without it nothing below
    // would fit, and the error would name another tensor.
    detail::io_require<StateDictError>(has(llama(1, ".weight")), where, [&] {
      return "'" + file.source() + "' has no tensor '" + prefix + llama(1, ".weight") +
             "' (next to '" + prefix + llama(0, ".weight") +
             "': the key/value heads are read from it)";
    });
    const auto k = matrix_shape(llama(1, ".weight"));
    const std::string o_proj = std::string(Names::kLlamaOutProj) + "weight";
    const auto out = has(o_proj) ? matrix_shape(o_proj) : std::vector<Index>{q[1], q[0]};
    const Index head_dim = num_heads > 0 ? q[0] / num_heads : 0;
    detail::io_require<StateDictError>(
        num_heads > 0 && q[0] > 0 && q[0] % num_heads == 0 && k[0] > 0 && k[0] % head_dim == 0,
        where, [&] {
          return "'" + file.source() + "': " + prefix + llama(0, ".weight") + " " +
                 detail::shape_text(q) + " and " + prefix + llama(1, ".weight") + " " +
                 detail::shape_text(k) +
                 " do not split into num_heads=" + std::to_string(num_heads) +
                 " query heads and whole key/value heads";
        });
    o.d_in = q[1];
    o.d_out = out[0];
    o.head_dim = head_dim;
    o.num_kv_heads = k[0] / head_dim;
    o.kdim = k[1];
    o.vdim = k[1];
    if (has(llama(2, ".weight"))) {  // value heads of their own size (DeepSeek)
      const auto v = matrix_shape(llama(2, ".weight"));
      detail::io_require<StateDictError>(v[0] > 0 && v[0] % o.num_kv_heads == 0, where, [&] {
        return "'" + file.source() + "': " + prefix + llama(2, ".weight") + " " +
               detail::shape_text(v) +
               " does not split into num_kv_heads=" + std::to_string(o.num_kv_heads) +
               " value heads";
      });
      o.vdim = v[1];
      if (v[0] / o.num_kv_heads != head_dim) o.value_head_dim = v[0] / o.num_kv_heads;
    }
    o.qkv_bias = has(llama(0, ".bias"));
    o.out_bias = has(std::string(Names::kLlamaOutProj) + "bias");
    o.init = InitScheme::kNone;
    return o;
  }
  if (has(notebook(0, ".weight"))) {
    const auto q = matrix_shape(notebook(0, ".weight"));
    o.d_out = q[0];
    o.d_in = q[1];
    o.kdim = has(notebook(1, ".weight")) ? matrix_shape(notebook(1, ".weight"))[1] : q[1];
    o.vdim = has(notebook(2, ".weight")) ? matrix_shape(notebook(2, ".weight"))[1] : q[1];
    o.qkv_bias = has(notebook(0, ".bias"));
    o.out_bias = has(out_bias);
    o.init = InitScheme::kLinear;
    return o;
  }
  if (has(Names::kInProjWeight)) {
    const auto w = matrix_shape(Names::kInProjWeight);
    detail::io_require<StateDictError>(w[0] % 3 == 0 && w[0] / 3 == w[1], where, [&] {
      return "'" + file.source() + "': " + Names::kInProjWeight + " has shape " +
             detail::shape_text(w) + ", expected (3 E, E)";
    });
    o.d_in = o.d_out = w[1];
  } else if (has(Names::separate_name(0))) {
    const auto q = matrix_shape(Names::separate_name(0));
    o.d_in = q[1];
    o.d_out = q[0];
    o.kdim = has(Names::separate_name(1)) ? matrix_shape(Names::separate_name(1))[1] : 0;
    o.vdim = has(Names::separate_name(2)) ? matrix_shape(Names::separate_name(2))[1] : 0;
  } else {
    detail::io_require<StateDictError>(false, where, [&] {
      return "'" + file.source() + "' has none of '" + prefix + Names::kInProjWeight + "', '" +
             prefix + Names::separate_name(0) + "', '" + prefix + notebook(0, ".weight") +
             "' or '" + prefix + llama(0, ".weight") + "' (is the prefix right?)";
    });
  }
  // nn.MultiheadAttention's one `bias` flag makes both in_proj_bias and out_proj.bias: either
  // one present means both, so a file that lacks the other fails to load (strictly) instead
  // of running without it.
  o.qkv_bias = o.out_bias = has(Names::kInProjBias) || has(out_bias);
  o.init = InitScheme::kMultiheadAttention;
  return o;
}

}  // namespace io
ATTN_NAMESPACE_END
