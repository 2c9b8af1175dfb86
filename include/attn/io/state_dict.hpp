// SPDX-License-Identifier: MIT
// attn/io/state_dict.hpp: load and save any attn module under its state_dict names, through
// the module's named_parameters() and named_buffers().
#pragma once

#include <algorithm>
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

namespace detail {

/// The head layout a state_dict's projection weights give, written into `o` (num_kv_heads,
/// head_dim, value_head_dim): from separate query, key and value weights (`rows` of each;
/// -1 for an absent key or value weight) or one fused weight (`fused_rows`, -1 if separate),
/// and the output projection's input features `out_features` (-1 without one). `known`
/// holds num_heads and the sizes the caller gives (0: read from the shapes); `shapes` names
/// the tensors and their shapes for the messages; o.d_out is already set. num_kv_heads and
/// head_dim are written when `explicit_sizes` or when they are not the defaults (num_heads,
/// d_out / num_heads); value_head_dim when it is not head_dim.
/// @throws StateDictError naming `shapes` when no layout fits, a given size does not, or a
///         fused weight fits several.
inline void read_head_layout(MultiHeadAttentionOptions& o, const MultiHeadAttentionOptions& known,
                             const std::vector<Index>& rows, Index fused_rows, Index out_features,
                             const std::string& shapes, bool explicit_sizes) {
  const char* where = "options_from_state_dict";
  const Index h = known.num_heads;
  const auto fail_unless = [&](bool ok, const auto& problem) {
    io_require<StateDictError>(ok, where, [&] { return shapes + ": " + problem(); });
  };
  const auto text = [](Index v) { return std::to_string(v); };
  const auto agree = [&](const char* what, Index given, Index found) {
    fail_unless(given == 0 || given == found, [&] {
      return std::string(what) + "=" + text(given) + " was given, the shapes give " + text(found);
    });
  };
  // The value heads' size from the output projection's input (H hd_v), when there is one.
  Index hd_v = 0;
  if (out_features >= 0) {
    fail_unless(out_features > 0 && out_features % h == 0, [&] {
      return "the output projection's " + text(out_features) +
             " input features do not split into num_heads=" + text(h) + " value heads";
    });
    hd_v = out_features / h;
    agree("value_head_dim", known.value_head_dim, hd_v);
  }
  Index kv = 0, hd = 0;
  if (fused_rows < 0) {  // separate weights: each size follows from one shape
    const Index q = rows[0], k = rows[1], v = rows[2];
    fail_unless(q > 0 && q % h == 0, [&] {
      return "the query projection's " + text(q) + " rows do not split into num_heads=" + text(h) +
             " heads";
    });
    hd = q / h;
    kv = known.num_kv_heads > 0 ? known.num_kv_heads : h;
    if (k >= 0) {
      fail_unless(k > 0 && k % hd == 0 && h % (k / hd) == 0, [&] {
        return "the key projection's " + text(k) +
               " rows are not whole heads of head_dim=" + text(hd) +
               " (the query rows / num_heads) whose number divides num_heads=" + text(h);
      });
      kv = k / hd;
    }
    if (v >= 0) {
      fail_unless(v > 0 && v % kv == 0, [&] {
        return "the value projection's " + text(v) +
               " rows do not split into num_kv_heads=" + text(kv) + " value heads";
      });
      fail_unless(hd_v == 0 || v / kv == hd_v, [&] {
        return "the value heads are " + text(v / kv) +
               " wide (the value rows / num_kv_heads=" + text(kv) +
               ") but the output projection takes num_heads=" + text(h) + " x " + text(hd_v) +
               " features";
      });
      hd_v = v / kv;
    }
  } else {
    // One fused weight of (H + H_kv) hd + H_kv hd_v rows: every H_kv dividing H with a whole
    // hd fits. H_kv = H (nn.MultiheadAttention's heads, no grouped-query ones) is taken when
    // it fits; else the one layout that fits, or the given sizes must settle it.
    if (hd_v == 0) hd_v = known.value_head_dim;  // still 0: as wide as the query heads
    std::vector<std::pair<Index, Index>> fits;   // (H_kv, hd)
    const auto try_kv = [&](Index g) {
      if (known.num_kv_heads > 0 && g != known.num_kv_heads) return;
      if (hd_v > 0 && hd_v > fused_rows / g) return;  // (a given hd_v: no overflow below)
      const Index rest = fused_rows - (hd_v > 0 ? g * hd_v : 0);
      const Index per_hd = h + g + (hd_v > 0 ? 0 : g);
      if (rest <= 0 || rest % per_hd != 0) return;
      if (known.head_dim > 0 && rest / per_hd != known.head_dim) return;
      fits.emplace_back(g, rest / per_hd);
    };
    for (Index g = 1; g <= h / g; ++g) {  // the divisors of H, in pairs (g, H / g)
      if (h % g != 0) continue;
      try_kv(g);
      if (h / g != g) try_kv(h / g);
    }
    std::sort(fits.begin(), fits.end());
    const auto all_heads =
        std::find_if(fits.begin(), fits.end(), [&](const auto& f) { return f.first == h; });
    const std::string given =
        (known.num_kv_heads > 0 ? ", num_kv_heads=" + text(known.num_kv_heads) : "") +
        (known.head_dim > 0 ? ", head_dim=" + text(known.head_dim) : "");
    fail_unless(!fits.empty(), [&] {
      return "the fused rows (num_heads + num_kv_heads) x head_dim + num_kv_heads x " +
             (hd_v > 0 ? "value_head_dim=" + text(hd_v) : std::string("head_dim")) +
             " fit no layout of num_heads=" + text(h) + given;
    });
    fail_unless(all_heads != fits.end() || fits.size() == 1, [&] {
      std::string list;
      for (const auto& [g, d] : fits) {
        list += (list.empty() ? "" : ", ") + std::string("num_kv_heads=") + text(g) +
                " with head_dim=" + text(d);
      }
      return "the fused rows fit several layouts of num_heads=" + text(h) + given + ": " + list +
             "; give num_kv_heads or head_dim";
    });
    const auto& chosen = all_heads != fits.end() ? *all_heads : fits.front();
    kv = chosen.first;
    hd = chosen.second;
  }
  if (hd_v == 0) hd_v = hd;
  agree("num_kv_heads", known.num_kv_heads, kv);
  agree("head_dim", known.head_dim, hd);
  agree("value_head_dim", known.value_head_dim, hd_v);
  if (explicit_sizes || kv != h) o.num_kv_heads = kv;
  if (explicit_sizes || o.d_out % h != 0 || o.d_out / h != hd) o.head_dim = hd;
  o.value_head_dim = hd_v != hd ? hd_v : 0;
}

}  // namespace detail

/// The MultiHeadAttentionOptions of the torch.nn.MultiheadAttention (or notebook
/// MultiHeadAttention, or Hugging Face Llama / Mistral / Qwen2 attention, or attn module)
/// whose state_dict `file` holds under `prefix`: d_in, d_out, kdim, vdim, the head sizes and
/// bias presence come from the tensors' shapes; num_heads is not stored in a state_dict and
/// must be given in `known`. The head sizes:
/// - separate projections (Llama's q_proj.weight, ...; q_proj_weight, ...; the notebooks'
///   W_query.weight, ...): head_dim is the query rows / num_heads, num_kv_heads the key rows
///   / head_dim and value_head_dim the value rows / num_kv_heads; the output projection's
///   input features must be num_heads x value_head_dim;
/// - a fused in_proj_weight ((num_heads + num_kv_heads) head_dim + num_kv_heads
///   value_head_dim rows): value_head_dim is out_proj.weight's input features / num_heads,
///   and num_kv_heads and head_dim a layout whose rows fit: num_kv_heads = num_heads
///   (nn.MultiheadAttention's heads) whenever it fits, else the one grouped-query layout that
///   does; when several do, the file is refused, listing them, unless `known` settles it
///   (a grouped-query module's file that num_kv_heads = num_heads fits too needs
///   known.num_kv_heads).
/// known.num_kv_heads, known.head_dim and known.value_head_dim, when not 0, are the model's
/// sizes: they are checked against the shapes and pick among a fused weight's layouts. The
/// fields a state_dict does not hold (causal, rope, sliding_window, the variants but sinks,
/// dropout, context_length) are kept from `known`. A `sinks` tensor (gpt-oss) sets sinks (its
/// length must be num_heads).
/// @throws StateDictError naming the tensors and their shapes if no known layout is found, the
///         shapes are inconsistent, a given size does not fit them, or they fit several
///         layouts.
inline MultiHeadAttentionOptions options_from_state_dict(const SafetensorsFile& file,
                                                         const MultiHeadAttentionOptions& known,
                                                         const std::string& prefix = "") {
  using Names = attn::detail::AttentionCore<float>;
  const char* where = "options_from_state_dict";
  const Index num_heads = known.num_heads;
  detail::io_require<StateDictError>(num_heads > 0, where, [&] {
    return "num_heads=" + std::to_string(num_heads) +
           " must be positive (a state_dict does not record it)";
  });
  const auto has = [&](const std::string& name) { return file.contains(prefix + name); };
  const auto matrix_shape = [&](const std::string& name) {
    const std::vector<Index>& s = file.shape(prefix + name);
    detail::io_require<StateDictError>(s.size() == 2, where, [&] {
      return "'" + file.source() + "': tensor '" + prefix + name + "' has shape " +
             detail::shape_text(s) + ", expected a matrix";
    });
    return s;
  };
  // "'file': q_proj.weight [8, 4], ..." for the tensors a layout is read from.
  const auto shapes_of = [&](const std::vector<std::string>& names) {
    std::string text = "'" + file.source() + "':";
    for (const std::string& name : names) {
      if (has(name))
        text += " " + prefix + name + " " + detail::shape_text(file.shape(prefix + name));
    }
    return text;
  };
  const auto rows_of = [&](const std::string& name) {
    return has(name) ? matrix_shape(name)[0] : Index{-1};
  };
  const auto notebook = [](int part, const char* what) {
    return std::string(Names::notebook_name(part)) + what;
  };
  const auto llama = [](int part, const char* what) {
    return std::string(Names::llama_name(part)) + what;
  };
  const std::string out_weight = std::string(Names::kOutProj) + "weight",
                    out_bias = std::string(Names::kOutProj) + "bias",
                    o_proj = std::string(Names::kLlamaOutProj) + "weight";
  MultiHeadAttentionOptions o = known;
  o.num_kv_heads = o.head_dim = o.value_head_dim = 0;
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
  // Separate projections: `names` are the query, key, value and output weights.
  const auto separate = [&](const std::vector<std::string>& names, bool explicit_sizes) {
    const auto q = matrix_shape(names[0]);
    o.d_in = q[1];
    o.d_out = has(names[3]) ? matrix_shape(names[3])[0] : q[0];
    detail::read_head_layout(o, known, {q[0], rows_of(names[1]), rows_of(names[2])}, -1,
                             has(names[3]) ? matrix_shape(names[3])[1] : Index{-1},
                             shapes_of(names), explicit_sizes);
  };
  if (has(llama(0, ".weight"))) {
    // The key/value heads and kdim are read from k_proj.weight: without it nothing below
    // would fit, and the error would name another tensor.
    detail::io_require<StateDictError>(has(llama(1, ".weight")), where, [&] {
      return "'" + file.source() + "' has no tensor '" + prefix + llama(1, ".weight") +
             "' (next to '" + prefix + llama(0, ".weight") +
             "': the key/value heads are read from it)";
    });
    separate({llama(0, ".weight"), llama(1, ".weight"), llama(2, ".weight"), o_proj}, true);
    if (!has(o_proj)) o.d_out = o.d_in;  // (o_proj maps the context back to the hidden size)
    o.kdim = matrix_shape(llama(1, ".weight"))[1];
    o.vdim = has(llama(2, ".weight")) ? matrix_shape(llama(2, ".weight"))[1] : o.kdim;
    o.qkv_bias = has(llama(0, ".bias"));
    o.out_bias = has(std::string(Names::kLlamaOutProj) + "bias");
    o.init = InitScheme::kNone;
    return o;
  }
  if (has(notebook(0, ".weight"))) {
    separate({notebook(0, ".weight"), notebook(1, ".weight"), notebook(2, ".weight"), out_weight},
             false);
    o.kdim = has(notebook(1, ".weight")) ? matrix_shape(notebook(1, ".weight"))[1] : o.d_in;
    o.vdim = has(notebook(2, ".weight")) ? matrix_shape(notebook(2, ".weight"))[1] : o.d_in;
    o.qkv_bias = has(notebook(0, ".bias"));
    o.out_bias = has(out_bias);
    o.init = InitScheme::kLinear;
    return o;
  }
  o.kdim = o.vdim = 0;
  if (has(Names::kInProjWeight)) {
    const auto w = matrix_shape(Names::kInProjWeight);
    o.d_in = w[1];
    o.d_out = has(out_weight) ? matrix_shape(out_weight)[0] : w[1];
    detail::read_head_layout(o, known, {}, w[0],
                             has(out_weight) ? matrix_shape(out_weight)[1] : Index{-1},
                             shapes_of({Names::kInProjWeight, out_weight}), false);
  } else if (has(Names::separate_name(0))) {
    separate(
        {Names::separate_name(0), Names::separate_name(1), Names::separate_name(2), out_weight},
        false);
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

/// options_from_state_dict() with nothing known but num_heads.
inline MultiHeadAttentionOptions options_from_state_dict(const SafetensorsFile& file,
                                                         Index num_heads,
                                                         const std::string& prefix = "") {
  MultiHeadAttentionOptions known;
  known.num_heads = num_heads;
  return options_from_state_dict(file, known, prefix);
}

}  // namespace io
ATTN_NAMESPACE_END
