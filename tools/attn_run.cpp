// SPDX-License-Identifier: MIT
// tools/attn_run.cpp: command-line runner for PyTorch-trained nn.MultiheadAttention weights
// and Hugging Face Llama-family attention layers (the logic is in tools/attn_run/; see
// docs/io.md).
//
//   attn_run --weights W.safetensors --input X.safetensors --output Y.safetensors
//            --num-heads H [--prefix P] [--causal] [--need-weights] [--per-head-weights]
//            [--double] [--dtype f32|f64|bf16] [--output-dtype bf16|f32]
//   attn_run --format llama --weights W.safetensors --input X.safetensors --output Y.safetensors
//            --num-heads H [--num-kv-heads HKV] [--head-dim HD] [--rope-theta THETA]
//            [--rotary-dim R] [--rope-interleaved] [--sliding-window W] [--prefill N]
//            [--chunk C] [--prefix P] [--double | --dtype bf16 [--output-dtype bf16|f32]]
//   attn_run --format onnx --input IN.safetensors --output OUT.safetensors [attributes]
//            [--double | --dtype f32|bf16 [--output-dtype bf16|f32]]
#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "attn_run/cli.hpp"

int main(int argc, char** argv) {
#ifdef SIGXFSZ
  // Past a file size limit (ulimit -f) the write then fails with EFBIG, which the writer
  // reports and cleans up after, instead of the signal killing the process mid-save.
  std::signal(SIGXFSZ, SIG_IGN);
#endif
  return attn_run::main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
