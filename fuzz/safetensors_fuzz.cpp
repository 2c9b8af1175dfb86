// SPDX-License-Identifier: MIT
// fuzz/safetensors_fuzz.cpp: libFuzzer target for attn::io. Any bytes given to the reader,
// then to get()/values(), state_dict loading and the runner, must either work or throw an
// attn::io::IoError (or, for shapes a module rejects, attn's std::logic_error family);
// never crash, leak, read out of bounds or hit undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"

namespace {

using attn::io::SafetensorsFile;

template <class Scalar>
void read_all_ranks(const SafetensorsFile& file, const std::string& name) {
  try {
    switch (file.rank(name)) {
      case 0:
      case 1: (void)file.get<Scalar, 1>(name); break;
      case 2: (void)file.get<Scalar, 2>(name); break;
      case 3: (void)file.get<Scalar, 3>(name); break;
      case 4: (void)file.get<Scalar, 4>(name); break;
      default: (void)file.values<Scalar>(name); break;
    }
    (void)file.get<Scalar, 2>(name);  // usually a rank mismatch
  } catch (const attn::io::FormatError&) {
  }
}

// Re-writing what was read must give the same bytes back.
void round_trip(const SafetensorsFile& file) {
  attn::io::SafetensorsWriter writer;
  for (const std::string& name : file.names()) {
    const attn::io::TensorInfo& info = file.info(name);
    std::vector<unsigned char> bytes(file.raw_data(name), file.raw_data(name) + (info.end - info.begin));
    writer.add_raw(name, info.dtype, info.shape, std::move(bytes));
  }
  for (const auto& [key, value] : file.metadata()) writer.set_metadata(key, value);
  const SafetensorsFile again = SafetensorsFile::from_bytes(writer.to_bytes());
  if (again.names() != file.names() || again.metadata() != file.metadata()) __builtin_trap();
  for (const std::string& name : file.names()) {
    const auto& a = file.info(name);
    const auto& b = again.info(name);
    if (a.dtype != b.dtype || a.shape != b.shape || a.end - a.begin != b.end - b.begin) __builtin_trap();
  }
}

bool small_module(const attn::MultiHeadAttentionOptions& o) {
  const auto fits = [](attn::Index d) { return d >= 0 && d <= 64; };
  return fits(o.d_in) && fits(o.d_out) && fits(o.kdim) && fits(o.vdim);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const SafetensorsFile file = SafetensorsFile::from_bytes(data, size, "fuzz");
    for (const std::string& name : file.names()) {
      (void)file.shape(name);
      read_all_ranks<float>(file, name);
      read_all_ranks<double>(file, name);
      read_all_ranks<bool>(file, name);
    }
    round_trip(file);
    // As a state_dict (weights under "w." when inputs share the file), then the runner.
    const std::uint8_t heads = size > 0 ? static_cast<std::uint8_t>(1 + data[size - 1] % 4) : 1;
    for (const char* prefix : {"", "w."}) {
      try {
        const auto options = attn::io::options_from_state_dict(file, heads, prefix);
        if (!small_module(options)) continue;
        attn::MultiHeadAttention<float> mha(options);
        attn::io::load_state_dict(mha, file, prefix, attn::io::Strict::kYes);
        if (file.contains("query")) {
          attn::io::RunOptions run;
          run.num_heads = heads;
          run.prefix = prefix;
          run.need_weights = (size & 1) != 0;
          run.causal = (size & 2) != 0;
          (void)attn::io::run_multi_head_attention<float>(file, file, run);
        }
      } catch (const attn::io::IoError&) {
      } catch (const std::logic_error&) {  // attn::ShapeError, std::invalid_argument
      }
    }
  } catch (const attn::io::IoError&) {
  }
  return 0;
}
