// SPDX-License-Identifier: MIT
// attn/io/detail/header.hpp: validation of a safetensors file's header, one check per
// function: the length field, the JSON (nesting, syntax, duplicate keys), "__metadata__",
// each tensor's dtype, shape and data_offsets, and the tiling of the data section.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/io/detail/convert.hpp"
#include "attn/io/detail/json.hpp"
#include "attn/io/dtype.hpp"
#include "attn/io/error.hpp"
#include "attn/io/tensor_info.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {
namespace detail {

/// Largest header the reader accepts (the reference implementation's limit).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

/// A validated header.
struct Header {
  std::size_t header_bytes = 0;  ///< N: the data section starts at byte 8 + N
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

/// Validates the header of the `size` bytes at `bytes`; every failure is a FormatError
/// "attn::io::SafetensorsFile: '<source>': <what>".
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& source) : source_(source) {}

  Header parse(const unsigned char* bytes, std::size_t size) const {
    Header header;
    header.header_bytes = header_length(bytes, size);
    const nlohmann::json root =
        parse_root(reinterpret_cast<const char*>(bytes + 8), header.header_bytes);
    const std::size_t data_size = size - 8 - header.header_bytes;
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        header.metadata = metadata(it.value());
      } else {
        header.tensors.emplace(it.key(), entry(it.key(), it.value(), data_size));
      }
    }
    check_tiling(header.tensors, data_size);
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw FormatError("attn::io::SafetensorsFile: '" + source_ + "': " + message);
  }

  /// The 8-byte little-endian length N: at most kMaxHeaderBytes, within the file, >= 2.
  std::size_t header_length(const unsigned char* bytes, std::size_t size) const {
    if (size < 8) {
      fail("file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
    }
    const auto length = load_le<std::uint64_t>(bytes);
    if (length > kMaxHeaderBytes) {
      fail("header length " + std::to_string(length) + " exceeds the limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (length > size - 8) {
      fail("header length " + std::to_string(length) + " exceeds the " + std::to_string(size - 8) +
           " bytes after the length field (file truncated?)");
    }
    if (length < 2) {
      fail("header length " + std::to_string(length) + " is too short for a JSON object");
    }
    return static_cast<std::size_t>(length);
  }

  /// The header as a JSON object: nesting bounded before parsing, no key given twice.
  nlohmann::json parse_root(const char* text, std::size_t size) const {
    const std::size_t deep = find_nesting_over(text, size, kMaxHeaderDepth);
    if (deep != size) {
      fail("header nests arrays and objects deeper than " + std::to_string(kMaxHeaderDepth) +
           " levels (at byte " + std::to_string(deep) + " of the header)");
    }
    nlohmann::json root;
    DuplicateKey duplicate;
    try {
      root = parse_json(text, size, duplicate);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("header is not valid JSON: ") + e.what());
    }
    if (!root.is_object()) {
      fail(std::string("header is a JSON ") + root.type_name() + ", expected an object");
    }
    if (duplicate.found) {
      if (duplicate.owner.empty()) {
        fail("the header names tensor '" + duplicate.key + "' more than once");
      }
      fail((duplicate.owner == "__metadata__" ? std::string("__metadata__")
                                              : "tensor '" + duplicate.owner + "'") +
           " has key '" + duplicate.key + "' more than once");
    }
    return root;
  }

  std::map<std::string, std::string> metadata(const nlohmann::json& value) const {
    if (!value.is_object()) {
      fail("__metadata__ is a JSON " + std::string(value.type_name()) +
           ", expected an object of strings");
    }
    std::map<std::string, std::string> out;
    for (auto m = value.begin(); m != value.end(); ++m) {
      if (!m.value().is_string()) {
        fail("__metadata__ entry '" + m.key() + "' is " + json_excerpt(m.value()) +
             ", expected a string");
      }
      out[m.key()] = m.value().get<std::string>();
    }
    return out;
  }

  TensorInfo entry(const std::string& name, const nlohmann::json& value,
                   std::size_t data_size) const {
    const std::string tensor = "tensor '" + name + "'";
    if (!value.is_object()) {
      fail(tensor + " is " + json_excerpt(value) +
           ", expected {\"dtype\", \"shape\", \"data_offsets\"}");
    }
    TensorInfo info;
    info.dtype = dtype(tensor, value);
    info.shape = shape(tensor, value);
    offsets(tensor, value, info, data_size);
    return info;
  }

  DType dtype(const std::string& tensor, const nlohmann::json& value) const {
    const auto it = value.find("dtype");
    if (it == value.end() || !it->is_string()) {
      fail(tensor + " has no string \"dtype\" (got " + json_excerpt(value) + ")");
    }
    DType out{};
    if (!parse_dtype(it->get_ref<const std::string&>(), out)) {
      fail(tensor + " has unknown dtype " + json_excerpt(*it) + " (expected " + dtype_names() +
           ")");
    }
    return out;
  }

  /// Non-negative integers whose non-zero product fits Index (so do the strides).
  std::vector<Index> shape(const std::string& tensor, const nlohmann::json& value) const {
    const auto it = value.find("shape");
    if (it == value.end() || !it->is_array()) {
      fail(tensor + " has no array \"shape\" (got " + json_excerpt(value) + ")");
    }
    std::vector<Index> out;
    for (const nlohmann::json& extent : *it) {
      if (!extent.is_number_integer()) {
        fail(tensor + " has shape " + json_excerpt(*it) +
             ": extents must be non-negative integers");
      }
      if (!extent.is_number_unsigned() && extent.get<std::int64_t>() < 0) {
        fail(tensor + " has shape " + json_excerpt(*it) + " with a negative extent");
      }
      const std::uint64_t e = extent.get<std::uint64_t>();
      if (e > static_cast<std::uint64_t>(std::numeric_limits<Index>::max())) {
        fail(tensor + " has shape " + json_excerpt(*it) + ", whose element count overflows");
      }
      out.push_back(static_cast<Index>(e));
    }
    Index count = 0;
    if (!attn::detail::checked_extent_product(out, count)) {
      fail(tensor + " has shape " + json_excerpt(*it) + ", whose element count overflows");
    }
    return out;
  }

  /// [begin, end] within the data section, spanning shape x dtype size bytes.
  void offsets(const std::string& tensor, const nlohmann::json& value, TensorInfo& info,
               std::size_t data_size) const {
    const auto it = value.find("data_offsets");
    if (it == value.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned()) {
      fail(tensor +
           (it != value.end() ? " has data_offsets " + json_excerpt(*it)
                              : std::string(" has no data_offsets")) +
           ", expected [begin, end] with non-negative integers");
    }
    const auto begin = (*it)[0].get<std::uint64_t>(), end = (*it)[1].get<std::uint64_t>();
    if (begin > end || end > data_size) {
      fail(tensor + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "], outside the data section of " + std::to_string(data_size) +
           " bytes (or begin > end)");
    }
    std::uint64_t bytes = 0;
    const bool fits =
        attn::detail::checked_mul(static_cast<std::uint64_t>(info.numel()),
                                  static_cast<std::uint64_t>(dtype_size(info.dtype)), bytes);
    if (!fits || bytes != end - begin) {
      fail(tensor + " (" + dtype_name(info.dtype) + ", shape " + shape_text(info.shape) +
           ") needs " + (fits ? std::to_string(bytes) : std::string("more than 2^64")) +
           " bytes, but data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] span " + std::to_string(end - begin));
    }
    info.begin = static_cast<std::size_t>(begin);
    info.end = static_cast<std::size_t>(end);
  }

  /// The tensors must tile [0, data_size) exactly, as the reference implementation checks.
  void check_tiling(const std::map<std::string, TensorInfo>& tensors, std::size_t data_size) const {
    std::vector<std::pair<const TensorInfo*, const std::string*>> ranges;
    ranges.reserve(tensors.size());
    for (const auto& [name, info] : tensors) ranges.emplace_back(&info, &name);
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
      return a.first->begin != b.first->begin ? a.first->begin < b.first->begin
                                              : a.first->end < b.first->end;
    });
    std::size_t covered = 0;
    const std::string* previous = nullptr;
    for (const auto& [info, name] : ranges) {
      if (info->begin < covered) {
        fail("tensor '" + *name + "' (bytes [" + std::to_string(info->begin) + ", " +
             std::to_string(info->end) + ")) overlaps tensor '" + *previous + "' (ending at " +
             std::to_string(covered) + ")");
      }
      if (info->begin > covered) {
        fail("bytes [" + std::to_string(covered) + ", " + std::to_string(info->begin) +
             ") of the data section belong to no tensor (before tensor '" + *name + "')");
      }
      covered = info->end;
      previous = name;
    }
    if (covered != data_size) {
      fail("the tensors cover " + std::to_string(covered) + " bytes but the data section has " +
           std::to_string(data_size) + " (trailing bytes)");
    }
  }

  const std::string& source_;
};

}  // namespace detail
}  // namespace io
ATTN_NAMESPACE_END
