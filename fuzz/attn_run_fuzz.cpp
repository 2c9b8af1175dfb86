// SPDX-License-Identifier: MIT
// fuzz/attn_run_fuzz.cpp: libFuzzer target for attn_run's argument and mask handling
// (tools/attn_run/). The input is a command line (up to the first newline, split at spaces)
// followed by a safetensors file of inputs (query, key, value, attn_mask, key_padding_mask
// of any dtype and shape). The arguments are parsed (never throwing), then run on that file
// with a fixed small nn.MultiheadAttention (E = 8), or with weights from the file itself
// under --prefix. Only attn::io::IoError or attn's std::logic_error family may escape the
// run, and what it returns must read back as a valid file. No file is opened or written.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "targets.hpp"

namespace attn_run_fuzz {
namespace {

const attn::io::SafetensorsFile& fixed_weights() {
  static const attn::io::SafetensorsFile file = [] {
    attn::TorchGenerator gen(5);
    const attn::MultiHeadAttention<float> m(attn::MultiHeadAttentionOptions::pytorch(8, 2), gen);
    attn::io::SafetensorsWriter w;
    attn::io::save_state_dict(m, w);
    return attn::io::SafetensorsFile::from_bytes(w.to_bytes(), "weights");
  }();
  return file;
}

std::vector<std::string> split_arguments(const std::string& line) {
  std::vector<std::string> out;
  std::string token;
  for (const char c : line) {
    if (c == ' ') {
      if (!token.empty()) out.push_back(token);
      token.clear();
    } else {
      token += c;
    }
  }
  if (!token.empty()) out.push_back(token);
  return out;
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  const auto* text = reinterpret_cast<const char*>(data);
  std::size_t line_end = 0;
  while (line_end < size && text[line_end] != '\n') ++line_end;
  if (line_end > 512) return 0;  // arguments are short; the rest is the file
  const attn_run::ParsedArguments parsed =
      attn_run::parse_arguments(split_arguments(std::string(text, line_end)));  // never throws
  if (parsed.action != attn_run::ParsedArguments::Action::kRun) return 0;
  const attn_run::Arguments& args = parsed.arguments;
  const std::size_t file_begin = line_end < size ? line_end + 1 : size;
  try {
    const auto input =
        attn::io::SafetensorsFile::from_bytes(data + file_begin, size - file_begin, "input");
    const bool own_weights =
        !args.run.prefix.empty() && input.contains(args.run.prefix + "out_proj.weight");
    const attn::io::SafetensorsWriter result =
        attn_run::run(args, own_weights ? input : fixed_weights(), input);
    const auto back = attn::io::SafetensorsFile::from_bytes(result.to_bytes());
    if (!back.contains("output") || back.contains("weights") != args.run.need_weights) {
      __builtin_trap();
    }
  } catch (const attn::io::IoError&) {
  } catch (const std::logic_error&) {  // attn::ShapeError, std::invalid_argument
  }
  return 0;
}

}  // namespace attn_run_fuzz
