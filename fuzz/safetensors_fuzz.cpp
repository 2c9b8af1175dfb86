// SPDX-License-Identifier: MIT
// fuzz/safetensors_fuzz.cpp: libFuzzer target for attn::io. Any bytes given to the reader,
// then to get()/values(), state_dict loading and the runner, must either work or throw an
// attn::io::IoError (or, for shapes a module rejects, attn's std::logic_error family);
// never crash, leak, read out of bounds, recurse without bound or hit undefined behaviour.
// The first 24 bytes also give the writer a shape (add_raw: overflow is rejected).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/detail/checked.hpp"
#include "attn/io/io.hpp"
#include "attn_run/run.hpp"
#include "targets.hpp"

namespace safetensors_fuzz {
namespace {

using attn::io::SafetensorsFile;

template <class Scalar>
void read_all_ranks(const SafetensorsFile& file, const std::string& name) {
  try {
    switch (file.rank(name)) {
      case 0:
      case 1:
        (void)file.get<Scalar, 1>(name);
        break;
      case 2:
        (void)file.get<Scalar, 2>(name);
        break;
      case 3:
        (void)file.get<Scalar, 3>(name);
        break;
      case 4:
        (void)file.get<Scalar, 4>(name);
        break;
      default:
        (void)file.values<Scalar>(name);
        break;
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
    std::vector<unsigned char> bytes(file.raw_data(name),
                                     file.raw_data(name) + (info.end - info.begin));
    writer.add_raw(name, info.dtype, info.shape, std::move(bytes));
  }
  for (const auto& [key, value] : file.metadata()) writer.set_metadata(key, value);
  const SafetensorsFile again = SafetensorsFile::from_bytes(writer.to_bytes());
  if (again.names() != file.names() || again.metadata() != file.metadata()) __builtin_trap();
  for (const std::string& name : file.names()) {
    const auto& a = file.info(name);
    const auto& b = again.info(name);
    if (a.dtype != b.dtype || a.shape != b.shape || a.end - a.begin != b.end - b.begin)
      __builtin_trap();
  }
}

// A shape decoded from the first 24 bytes (extents up to 2^62) given to add_raw() with no
// bytes: a shape whose byte count overflows must be rejected, never matched by an empty
// buffer; only zero-element shapes are accepted.
void writer_sizes(const std::uint8_t* data, std::size_t size) {
  if (size < 24) return;
  std::vector<attn::Index> shape(3);
  for (std::size_t r = 0; r < 3; ++r) {
    std::uint64_t e = 0;
    for (std::size_t i = 0; i < 8; ++i) e |= static_cast<std::uint64_t>(data[8 * r + i]) << (8 * i);
    shape[r] = static_cast<attn::Index>(e >> (2 + data[8 * r] % 60));
  }
  attn::Index count = 0;
  const bool fits = attn::detail::checked_extent_product(shape, count);
  try {
    attn::io::SafetensorsWriter writer;
    writer.add_raw("w", attn::io::DType::kF64, shape, {});
    if (!fits || count != 0) __builtin_trap();
  } catch (const std::invalid_argument&) {
    if (fits && count == 0) __builtin_trap();
  }
}

bool small_module(const attn::MultiHeadAttentionOptions& o) {
  const auto fits = [](attn::Index d) { return d >= 0 && d <= 64; };
  return fits(o.d_in) && fits(o.d_out) && fits(o.kdim) && fits(o.vdim);
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  writer_sizes(data, size);
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
          attn_run::RunOptions run;
          run.num_heads = heads;
          run.prefix = prefix;
          run.need_weights = (size & 1) != 0;
          run.causal = (size & 2) != 0;
          (void)attn_run::run_multi_head_attention<float>(file, file, run);
        }
      } catch (const attn::io::IoError&) {
      } catch (const std::logic_error&) {  // attn::ShapeError, std::invalid_argument
      }
    }
  } catch (const attn::io::IoError&) {
  }
  return 0;
}

}  // namespace safetensors_fuzz
