// SPDX-License-Identifier: MIT
// tools/attn_run.cpp: command-line runner for PyTorch-trained nn.MultiheadAttention weights.
//
//   attn_run --weights W.safetensors --input X.safetensors --output Y.safetensors
//            --num-heads H [--prefix P] [--causal] [--need-weights] [--per-head-weights]
//            [--double]
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "attn/io/io.hpp"

namespace {

constexpr const char* kUsage = R"(usage: attn_run --weights W.safetensors --input X.safetensors
                --output Y.safetensors --num-heads H [options]

Runs torch.nn.MultiheadAttention(batch_first=True) in eval mode with the state_dict in
W (in_proj_weight, in_proj_bias or q/k/v_proj_weight, out_proj.weight, out_proj.bias;
embed_dim, kdim, vdim and bias come from their shapes) on the tensors in X:
  query             (B, T_q, E) or (T_q, E)                     required
  key, value        (B, T_k, kdim), (B, T_k, vdim)              optional, both or neither
  attn_mask         BOOL: true = blocked; float: added to scores
                    (T_q, T_k) or (B*H, T_q, T_k)                optional
  key_padding_mask  BOOL (B, T_k), true = padding               optional
and writes to Y: output (B, T_q, E), and weights (B, T_q, T_k) with --need-weights.
Fully masked rows give zeros (PyTorch gives NaN).

options:
  --weights PATH        safetensors file with the module's state_dict
  --input PATH          safetensors file with the inputs
  --output PATH         safetensors file to write
  --num-heads H         number of heads (not stored in a state_dict)
  --prefix P            prefix of the weight names (e.g. "encoder.self_attn.")
  --causal              add a causal mask, triu(ones(T_q, T_k), diagonal=1)
  --need-weights        also write the attention weights averaged over heads
  --per-head-weights    write per-head weights (B, H, T_q, T_k) instead (implies --need-weights)
  --double              compute in double (F64 output); default float (F32)
  --help                print this help
exit status: 0 on success, 1 on a bad file or failed run, 2 on bad arguments.
)";

struct Arguments {
  std::string weights, input, output;
  attn::io::RunOptions run;
  bool use_double = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "attn_run: " << message << "\n(run attn_run --help for usage)\n";
  std::exit(2);
}

attn::Index parse_positive(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value <= 0 || value > (1LL << 30)) {
    usage_error(flag + " expects a positive integer, got '" + text + "'");
  }
  return static_cast<attn::Index>(value);
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (flag == "--weights") {
      args.weights = value();
    } else if (flag == "--input") {
      args.input = value();
    } else if (flag == "--output") {
      args.output = value();
    } else if (flag == "--num-heads") {
      args.run.num_heads = parse_positive(flag, value());
    } else if (flag == "--prefix") {
      args.run.prefix = value();
    } else if (flag == "--causal") {
      args.run.causal = true;
    } else if (flag == "--need-weights") {
      args.run.need_weights = true;
    } else if (flag == "--per-head-weights") {
      args.run.need_weights = true;
      args.run.average_weights = false;
    } else if (flag == "--double") {
      args.use_double = true;
    } else {
      usage_error("unknown argument '" + flag + "'");
    }
  }
  if (args.weights.empty()) usage_error("--weights is required");
  if (args.input.empty()) usage_error("--input is required");
  if (args.output.empty()) usage_error("--output is required");
  if (args.run.num_heads == 0) usage_error("--num-heads is required");
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  try {
    const auto weights = attn::io::SafetensorsFile::open(args.weights);
    const auto input = attn::io::SafetensorsFile::open(args.input);
    const attn::io::SafetensorsWriter result =
        args.use_double ? attn::io::run_multi_head_attention<double>(weights, input, args.run)
                        : attn::io::run_multi_head_attention<float>(weights, input, args.run);
    result.save(args.output);
  } catch (const std::exception& e) {
    std::cerr << "attn_run: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
