// SPDX-License-Identifier: MIT
// tools/attn_run/cli.hpp: attn_run's command line: parsing the arguments (no exit, so the
// tests and the fuzz target can call it) and the whole program as a function.
#pragma once

#include <cmath>
#include <exception>
#include <ostream>
#include <string>
#include <vector>

#include "attn/io/safetensors.hpp"
#include "attn/isa.hpp"
#include "attn/version.hpp"
#include "attn_run/llama.hpp"
#include "attn_run/onnx.hpp"
#include "attn_run/run.hpp"

namespace attn_run {

inline constexpr const char* kUsage =
    R"(usage: attn_run --weights W.safetensors --input X.safetensors
                --output Y.safetensors --num-heads H [options]
       attn_run --format llama --weights W.safetensors --input X.safetensors
                --output Y.safetensors --num-heads H [--num-kv-heads HKV] [--head-dim HD]
                [--value-head-dim HDV] [--rope-theta THETA] [--rotary-dim R]
                [--rope-interleaved] [--sliding-window W [--sink-tokens S]]
                [--prefill N] [--chunk C] [--prefix P]
                [--double | --dtype bf16|fp16 [--output-dtype bf16|fp16|f32]]
       attn_run --format onnx --input IN.safetensors --output OUT.safetensors
                [--q-num-heads N --kv-num-heads N] [--is-causal 0|1] [--scale S]
                [--softcap C] [--qk-matmul-output-mode M] [--softmax-precision P]
                [--double | --dtype f32|bf16|fp16 [--output-dtype bf16|fp16|f32]]
       attn_run --dtype bf16|fp16 --weights W.safetensors --input X.safetensors
                --output Y.safetensors --num-heads H [--prefix P] [--causal]
                [--output-dtype bf16|fp16|f32]

Runs torch.nn.MultiheadAttention(batch_first=True) in eval mode with the state_dict in
W (in_proj_weight, in_proj_bias or q/k/v_proj_weight, out_proj.weight, out_proj.bias;
embed_dim, kdim, vdim, the head sizes and bias come from their shapes, as an attn module
with grouped-query heads or value heads of their own size saves them) on the tensors in X:
  query             (B, T_q, E) or (T_q, E)                     required
  key, value        (B, T_k, kdim), (B, T_k, vdim)              optional, both or neither
  attn_mask         BOOL or U8: true = blocked; float: added to scores
                    (T_q, T_k) or (B*H, T_q, T_k)                optional
  key_padding_mask  BOOL or U8 (B, T_k), true = padding; float:
                    added to the scores (only without attn_mask) optional
  grad_output       (B, T_q, E) or (T_q, E)   with --backward: the gradient of the output
                    (default: ones, the gradient of output.sum())  optional
and writes to Y: output (B, T_q, E), and weights (B, T_q, T_k) with --need-weights.
Fully masked rows give zeros (PyTorch gives NaN). Y is replaced atomically: if writing it
fails, the old file is left as it was (so --output may name the --input file). Y must be a
regular file or a new one: a directory, FIFO, socket or device (or a symbolic link to one)
is refused before anything is computed.

With --format llama it runs a Hugging Face Llama / Mistral / Qwen2 attention layer (W holds
q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight and optional q/k/v/o_proj.bias)
on X's `query` (B, T, D) hidden states and writes `output` (B, T, D): LlamaAttention's
forward with a causal mask, RoPE at positions 0..T-1, grouped-query heads and an optional
sliding window. It runs as generation does, through a KV cache: the first --prefill tokens
(default T) in one step, then the rest --chunk tokens at a time (default 1).

With --format onnx it runs the ONNX Attention operator (opsets 23 and 24, as Attention-24;
see docs/onnx.md) on IN's tensors under the operator's names: Q, K, V (3-D (B, S, heads *
head size) or 4-D (B, heads, S, head size)) and optional attn_mask (BOOL, true = attend, or
float, added), past_key, past_value, nonpad_kv_seqlen (I64); it writes Y, present_key and
present_value (with a past) and qk_matmul_output (with --qk-matmul-output-mode). No --weights.

options:
  --format mha|llama|onnx  what W holds (default mha: nn.MultiheadAttention), or the ONNX
                        Attention operator (no weights)
  --weights PATH        safetensors file with the module's state_dict
  --input PATH          safetensors file with the inputs
  --output PATH         safetensors file to write
  --num-heads H         number of heads (not stored in a state_dict)
  --prefix P            prefix of the weight names (e.g. "encoder.self_attn.")
  --num-kv-heads HKV    key/value heads (default: what the shapes give; checked against
                        them). A fused in_proj_weight that several grouped-query layouts
                        fit needs it or --head-dim
  --head-dim HD         features per query and key head (default: the query rows / H)
  --value-head-dim HDV  features per value head (default: the value rows / HKV, or
                        out_proj.weight's input features / H)
  --causal              add a causal mask, triu(ones(T_q, T_k), diagonal=1)
  --need-weights        also write the attention weights averaged over heads
  --per-head-weights    write per-head weights (B, H, T_q, T_k) instead (implies --need-weights)
  --double              compute in double (F64 output); default float (F32); --dtype f64
  --dtype f32|f64|bf16|fp16  what the module computes in (default f32). bf16 runs
                        MultiHeadAttention<bfloat16>: weights and query, key, value (and
                        grad_output) loaded as bfloat16 (BF16 bit for bit, F32/F64 rounded to
                        nearest even), float masks kept float, output (and with --backward the
                        gradients) written as BF16; --need-weights and --per-head-weights are
                        refused. --format llama (bf16): a bfloat16 KV cache (--kv-dtype f32
                        or bf16 only; --paged too), the error against the float run printed.
                        --format onnx (bf16): the operator's type (see below). fp16 runs
                        MultiHeadAttention<float16> the same way with F16 (a float16 KV cache,
                        --kv-dtype f32 or fp16)
  --output-dtype bf16|fp16|f32  with --dtype bf16 (fp16): write the output as BF16 (F16,
                        the default) or widened exactly to F32
  --backward            also write grad_query (with key and value: grad_key, grad_value)
                        and grad.<name> per parameter (grad.in_proj_weight, ...): the
                        gradients of sum(grad_output * output), as PyTorch autograd gives
                        (mha format only)
llama options:
  --rope-theta THETA    RoPE base (default 10000)
  --rotary-dim R        rotate the first R features of each head (default: head_dim)
  --rope-interleaved    pairs (x[2i], x[2i+1]) (Meta, GPT-J); default rotate_half (HF)
  --sliding-window W    query at position p sees keys in (p - W, p] (Mistral)
  --sink-tokens S       with --sliding-window W: also the first S tokens, at positions
                        within the cache (StreamingLLM's attention sinks; KVCacheOptions::
                        sink_tokens): S + W positions at most, however long the input
  --prefill N           tokens of the first step (default: all); the rest in chunks
  --chunk C             tokens per step after the prefill (default 1)
  --kv-dtype T          what the KV cache stores: f32 (default; the computation's type),
                        bf16, fp16, fp8e4m3, fp8e5m2, int8, int4 (groups of 32); not f32:
                        the run is repeated with a float cache and the output's relative
                        error against it printed (and kept in Y's metadata)
  --paged S             a paged KV cache of blocks of S tokens (as vLLM's); compared with a
                        contiguous float cache as --kv-dtype is (f32 rows: the same bits)
onnx options (the operator's attributes; unset: the attribute's default):
  --q-num-heads N, --kv-num-heads N   head counts of 3-D inputs (both required for them)
  --is-causal 0|1       the causal frontier: query i sees keys j <= i + P (P past keys)
  --scale S             multiplies Q K^T (default 1/sqrt(head size)); not negative
  --softcap C           C * tanh(scores / C) before the mask (0: off)
  --qk-matmul-output-mode M  also write qk_matmul_output: 0 scaled scores, 1 after softcap,
                        2 after the mask, 3 the softmax's probabilities
  --softmax-precision P the softmax's type (ONNX type code): 1 FLOAT, 10 FLOAT16,
                        11 DOUBLE, 16 BFLOAT16 (default: the inputs' type)
  The operator's type is Q's when it is BF16 or F16 (else F32), or --dtype's: inputs are
  read as values of it, outputs written in it (docs/onnx.md, "Element types").
  --help                print this help
  --version             print attn's version and the kernel set it runs (ATTN_ISA forces one)
exit status: 0 on success, 1 on a bad file or failed run, 2 on bad arguments.
)";

struct Arguments {
  std::string weights, input, output;
  bool llama = false;  ///< --format llama
  bool onnx = false;   ///< --format onnx
  RunOptions run;      ///< num_heads and prefix are shared by both formats
  LlamaOptions llama_options;
  OnnxOptions onnx_options;
  bool use_double = false;  ///< --double, --dtype f64
  bool use_bf16 = false;    ///< --dtype bf16
  bool use_fp16 = false;    ///< --dtype fp16
};

/// The outcome of parsing: run with `arguments`, print the usage, or a usage error.
struct ParsedArguments {
  enum class Action { kRun, kHelp, kVersion, kError } action = Action::kRun;
  Arguments arguments;
  std::string error;  ///< for kError
};

inline bool parse_positive(const std::string& text, attn::Index& out) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  if (used != text.size() || value <= 0 || value > (1LL << 30)) return false;
  out = static_cast<attn::Index>(value);
  return true;
}

inline bool parse_positive(const std::string& text, double& out) {
  std::size_t used = 0;
  try {
    out = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size() && std::isfinite(out) && out > 0;
}

inline bool parse_integer(const std::string& text, long long& out) {
  std::size_t used = 0;
  try {
    out = std::stoll(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size();
}

inline bool parse_finite(const std::string& text, double& out) {
  std::size_t used = 0;
  try {
    out = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size() && std::isfinite(out);
}

/// Parses attn_run's arguments (without the program name).
inline ParsedArguments parse_arguments(const std::vector<std::string>& argv) {
  ParsedArguments parsed;
  Arguments& args = parsed.arguments;
  const auto error = [&](const std::string& message) {
    parsed.action = ParsedArguments::Action::kError;
    parsed.error = message;
    return parsed;
  };
  LlamaOptions& llama = args.llama_options;
  OnnxOptions& onnx = args.onnx_options;
  // Flags of one format only: which, for the error when they meet another.
  std::vector<std::string> mha_flags, llama_flags, onnx_flags, weight_flags;
  std::string dtype;         // --dtype as given ("" = not given)
  bool double_flag = false;  // --double
  std::string output_dtype;  // --output-dtype as given ("" = not given)
  const auto positive = [&](const std::string& flag, const std::string& value, auto& out) {
    llama_flags.push_back(flag);
    return parse_positive(value, out);
  };
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& flag = argv[i];
    const bool takes_value =
        flag == "--weights" || flag == "--input" || flag == "--output" || flag == "--num-heads" ||
        flag == "--prefix" || flag == "--format" || flag == "--num-kv-heads" ||
        flag == "--head-dim" || flag == "--value-head-dim" || flag == "--rope-theta" ||
        flag == "--rotary-dim" || flag == "--sliding-window" || flag == "--sink-tokens" ||
        flag == "--prefill" || flag == "--chunk" || flag == "--q-num-heads" ||
        flag == "--kv-num-heads" || flag == "--is-causal" || flag == "--scale" ||
        flag == "--softcap" || flag == "--qk-matmul-output-mode" || flag == "--softmax-precision" ||
        flag == "--kv-dtype" || flag == "--dtype" || flag == "--output-dtype" || flag == "--paged";
    if (takes_value && i + 1 >= argv.size()) return error(flag + " needs a value");
    const std::string value = takes_value ? argv[++i] : std::string();
    if (flag == "--q-num-heads" || flag == "--kv-num-heads") {
      onnx_flags.push_back(flag);
      if (!parse_positive(value, flag == "--q-num-heads" ? onnx.q_num_heads : onnx.kv_num_heads)) {
        return error(flag + " expects a positive integer, got '" + value + "'");
      }
      continue;
    }
    if (flag == "--is-causal" || flag == "--qk-matmul-output-mode" ||
        flag == "--softmax-precision") {
      onnx_flags.push_back(flag);
      long long number = 0;
      if (!parse_integer(value, number)) {
        return error(flag + " expects an integer, got '" + value + "'");
      }
      if (flag == "--is-causal") {
        if (number != 0 && number != 1)
          return error("--is-causal expects 0 or 1, got '" + value + "'");
        onnx.is_causal = static_cast<int>(number);
      } else if (flag == "--qk-matmul-output-mode") {
        onnx.qk_matmul_output_mode = number;
      } else {
        onnx.softmax_precision = number;
      }
      continue;
    }
    if (flag == "--scale" || flag == "--softcap") {
      onnx_flags.push_back(flag);
      double number = 0;
      if (!parse_finite(value, number)) {
        return error(flag + " expects a finite number, got '" + value + "'");
      }
      if (flag == "--scale") {
        onnx.scale = number;
      } else {
        onnx.softcap = number;
      }
      continue;
    }
    if (flag == "--num-kv-heads" || flag == "--head-dim" || flag == "--value-head-dim") {
      weight_flags.push_back(flag);
      attn::Index* const target = flag == "--num-kv-heads" ? &args.run.num_kv_heads
                                  : flag == "--head-dim"   ? &args.run.head_dim
                                                           : &args.run.value_head_dim;
      if (!parse_positive(value, *target)) {
        return error(flag + " expects a positive integer, got '" + value + "'");
      }
      continue;
    }
    if (flag == "--rotary-dim" || flag == "--sliding-window" || flag == "--sink-tokens" ||
        flag == "--prefill" || flag == "--chunk") {
      attn::Index* const target = flag == "--rotary-dim"       ? &llama.rotary_dim
                                  : flag == "--sliding-window" ? &llama.sliding_window
                                  : flag == "--sink-tokens"    ? &llama.sink_tokens
                                  : flag == "--prefill"        ? &llama.prefill
                                                               : &llama.chunk;
      if (!positive(flag, value, *target)) {
        return error(flag + " expects a positive integer, got '" + value + "'");
      }
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      parsed.action = ParsedArguments::Action::kHelp;
      return parsed;
    } else if (flag == "--version") {
      parsed.action = ParsedArguments::Action::kVersion;
      return parsed;
    } else if (flag == "--weights") {
      weight_flags.push_back(flag);
      args.weights = value;
    } else if (flag == "--input") {
      args.input = value;
    } else if (flag == "--output") {
      args.output = value;
    } else if (flag == "--num-heads") {
      weight_flags.push_back(flag);
      if (!parse_positive(value, args.run.num_heads)) {
        return error(flag + " expects a positive integer, got '" + value + "'");
      }
    } else if (flag == "--prefix") {
      weight_flags.push_back(flag);
      args.run.prefix = value;
    } else if (flag == "--format") {
      if (value != "mha" && value != "llama" && value != "onnx") {
        return error("--format expects mha, llama or onnx, got '" + value + "'");
      }
      args.llama = value == "llama";
      args.onnx = value == "onnx";
    } else if (flag == "--rope-theta") {
      if (!positive(flag, value, llama.rope_theta)) {
        return error(flag + " expects a positive number, got '" + value + "'");
      }
    } else if (flag == "--kv-dtype") {
      llama_flags.push_back(flag);
      bool known = value == "f32";
      if (known) llama.kv_element = attn::KVElement::kScalar;
      for (const attn::KVElement e :
           {attn::KVElement::kBFloat16, attn::KVElement::kFloat16, attn::KVElement::kFloat8E4M3,
            attn::KVElement::kFloat8E5M2, attn::KVElement::kInt8, attn::KVElement::kInt4}) {
        if (value == attn::kv_element_name(e)) llama.kv_element = e, known = true;
      }
      if (!known) {
        return error("--kv-dtype expects f32, bf16, fp16, fp8e4m3, fp8e5m2, int8 or int4, got '" +
                     value + "'");
      }
    } else if (flag == "--paged") {
      llama_flags.push_back(flag);
      if (!positive(flag, value, llama.paged_block)) {
        return error(flag + " expects a positive block size in tokens, got '" + value + "'");
      }
    } else if (flag == "--rope-interleaved") {
      llama_flags.push_back(flag);
      llama.rope_interleaved = true;
    } else if (flag == "--causal") {
      mha_flags.push_back(flag);
      args.run.causal = true;
    } else if (flag == "--need-weights") {
      mha_flags.push_back(flag);
      args.run.need_weights = true;
    } else if (flag == "--per-head-weights") {
      mha_flags.push_back(flag);
      args.run.need_weights = true;
      args.run.average_weights = false;
    } else if (flag == "--double") {
      double_flag = true;
    } else if (flag == "--dtype") {
      if (value != "f32" && value != "f64" && value != "bf16" && value != "fp16") {
        return error("--dtype expects f32, f64, bf16 or fp16, got '" + value + "'");
      }
      dtype = value;
    } else if (flag == "--output-dtype") {
      if (value != "bf16" && value != "fp16" && value != "f32") {
        return error("--output-dtype expects bf16, fp16 or f32, got '" + value + "'");
      }
      output_dtype = value;
      args.run.widen_output = value == "f32";
    } else if (flag == "--backward") {
      mha_flags.push_back(flag);
      args.run.backward = true;
    } else {
      return error("unknown argument '" + flag + "'");
    }
  }
  if (double_flag && !dtype.empty() && dtype != "f64") {
    return error("--double and --dtype " + dtype + " disagree");
  }
  args.use_double = double_flag || dtype == "f64";
  args.use_bf16 = dtype == "bf16";
  args.use_fp16 = dtype == "fp16";
  const bool narrow = args.use_bf16 || args.use_fp16;
  if (!output_dtype.empty() && (!narrow || (output_dtype != "f32" && output_dtype != dtype))) {
    return error(output_dtype == "f32"
                     ? std::string("--output-dtype needs --dtype bf16 or fp16")
                     : "--output-dtype " + output_dtype + " needs --dtype " + output_dtype);
  }
  if (narrow) {
    // What a bfloat16 or float16 module does not do yet: attention weights, a KV cache of
    // rows other than its own type.
    const std::string unsupported =
        " (--dtype " + dtype +
        " runs the mha format's forward and --backward, and --format llama and onnx: "
        "--need-weights, --per-head-weights, and with --format llama --kv-dtype "
        "other than f32 or " +
        dtype + ", need --dtype f32 or f64)";
    const attn::KVElement own = args.use_bf16 ? attn::kv_element_of<attn::bfloat16>()
                                              : attn::kv_element_of<attn::float16>();
    for (const std::string& flag : llama_flags) {
      const bool quantised = flag == "--kv-dtype" && llama.kv_element != attn::KVElement::kScalar &&
                             llama.kv_element != own;
      if (quantised) {
        return error(flag + " " + attn::kv_element_name(llama.kv_element) +
                     " is not supported with --dtype " + dtype + unsupported);
      }
    }
    for (const std::string& flag : mha_flags) {
      if (flag != "--causal" && flag != "--backward") {
        return error(flag + " is not supported with --dtype " + dtype + unsupported);
      }
    }
  }
  if (args.onnx) {
    // --dtype names the operator's type T1 (unset: Q's, see run_onnx_attention()).
    if (dtype == "bf16") onnx.input_type = attn::io::DType::kBF16;
    if (dtype == "fp16") onnx.input_type = attn::io::DType::kF16;
    if (dtype == "f32") onnx.input_type = attn::io::DType::kF32;
    onnx.widen_output = args.run.widen_output;
    for (const auto* flags : {&weight_flags, &mha_flags, &llama_flags}) {
      if (!flags->empty()) {
        return error(flags->front() +
                     " is not used with --format onnx (the operator's inputs hold Q, K and V)");
      }
    }
    if (args.input.empty()) return error("--input is required");
    if (args.output.empty()) return error("--output is required");
    return parsed;
  }
  if (!onnx_flags.empty()) return error(onnx_flags.front() + " needs --format onnx");
  if (args.weights.empty()) return error("--weights is required");
  if (args.input.empty()) return error("--input is required");
  if (args.output.empty()) return error("--output is required");
  if (args.run.num_heads == 0) return error("--num-heads is required");
  const std::vector<std::string>& misplaced = args.llama ? mha_flags : llama_flags;
  if (!misplaced.empty()) {
    return error(misplaced.front() +
                 (args.llama ? " is not used with --format llama" : " needs --format llama"));
  }
  llama.num_heads = args.run.num_heads;
  llama.num_kv_heads = args.run.num_kv_heads;
  llama.head_dim = args.run.head_dim;
  llama.value_head_dim = args.run.value_head_dim;
  llama.prefix = args.run.prefix;
  llama.widen_output = args.run.widen_output;
  return parsed;
}

/// Runs parsed arguments on opened files (what main does after opening them).
/// With --kv-dtype other than f32 (or --paged), `kv_error` (when not null) receives the
/// output's error against a float cache's; with --format llama --dtype bf16 or fp16, against
/// the float run's.
inline attn::io::SafetensorsWriter run(const Arguments& args,
                                       const attn::io::SafetensorsFile& weights,
                                       const attn::io::SafetensorsFile& input,
                                       double* kv_error = nullptr) {
  if (args.llama) {
    if (args.use_bf16)
      return run_llama<attn::bfloat16>(weights, input, args.llama_options, kv_error);
    if (args.use_fp16)
      return run_llama<attn::float16>(weights, input, args.llama_options, kv_error);
    return args.use_double ? run_llama<double>(weights, input, args.llama_options, kv_error)
                           : run_llama<float>(weights, input, args.llama_options, kv_error);
  }
  if (args.use_bf16) return run_multi_head_attention<attn::bfloat16>(weights, input, args.run);
  if (args.use_fp16) return run_multi_head_attention<attn::float16>(weights, input, args.run);
  return args.use_double ? run_multi_head_attention<double>(weights, input, args.run)
                         : run_multi_head_attention<float>(weights, input, args.run);
}

/// The whole program: returns the exit status (0, 1 for a bad file or a failed run, 2 for
/// bad arguments), printing to `out` (help) and `err` (errors).
inline int main(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  const ParsedArguments parsed = parse_arguments(argv);
  if (parsed.action == ParsedArguments::Action::kHelp) {
    out << kUsage;
    return 0;
  }
  if (parsed.action == ParsedArguments::Action::kVersion) {
    try {
      out << "attn_run (attn " << attn::version()
          << "), kernels: " << attn::isa_name(attn::active_isa())
          << " (best on this CPU: " << attn::isa_name(attn::best_isa()) << ")\n";
    } catch (const std::exception& e) {  // a bad ATTN_ISA
      err << "attn_run: error: " << e.what() << "\n";
      return 2;
    }
    return 0;
  }
  if (parsed.action == ParsedArguments::Action::kError) {
    err << "attn_run: " << parsed.error << "\n(run attn_run --help for usage)\n";
    return 2;
  }
  const Arguments& args = parsed.arguments;
  try {
    // Before anything is read or computed: the output must be a regular file or a new one
    // (the writer checks again just before it renames its temporary file over it).
    attn::io::detail::check_replaceable(args.output, "SafetensorsWriter::save");
    if (args.onnx) {
      const auto input = attn::io::SafetensorsFile::open(args.input);
      (args.use_double ? run_onnx_attention<double>(input, args.onnx_options)
                       : run_onnx_attention<float>(input, args.onnx_options))
          .save(args.output);
      return 0;
    }
    const auto weights = attn::io::SafetensorsFile::open(args.weights);
    const auto input = attn::io::SafetensorsFile::open(args.input);
    double kv_error = -1;
    run(args, weights, input, &kv_error).save(args.output);
    if (kv_error >= 0 && (args.use_bf16 || args.use_fp16)) {
      out << "attn_run: " << (args.use_bf16 ? "bf16" : "fp16")
          << ": ||output - float output|| / ||float output|| = " << kv_error << "\n";
    } else if (kv_error >= 0) {
      out << "attn_run: KV cache " << attn::kv_element_name(args.llama_options.kv_element)
          << (args.llama_options.paged_block > 0
                  ? ", paged in blocks of " + std::to_string(args.llama_options.paged_block)
                  : std::string())
          << ": ||output - output with a float cache|| / ||output with a float cache|| = "
          << kv_error << "\n";
    }
  } catch (const std::exception& e) {
    err << "attn_run: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace attn_run
