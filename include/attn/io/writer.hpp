// SPDX-License-Identifier: MIT
// attn/io/writer.hpp: SafetensorsWriter, which collects named tensors and writes one
// safetensors file (replacing an existing one atomically).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/io/detail/convert.hpp"
#include "attn/io/detail/file.hpp"
#include "attn/io/detail/json.hpp"
#include "attn/io/dtype.hpp"
#include "attn/io/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// Collects named tensors and writes them as one safetensors file. Tensors are copied in
/// when added (any strides), so the sources need not outlive the writer. float is written
/// as F32, double as F64, bfloat16 as BF16 and float16 as F16 (their bits, unchanged) and
/// bool as BOOL; add_raw() writes any dtype from raw bytes. The
/// header is padded with spaces to a multiple of 8 bytes and the data is ordered by
/// element size (largest first), then by name, as the reference implementation does.
class SafetensorsWriter {
 public:
  /// Adds tensor `name` (row-major copy of `tensor`).
  /// @throws std::invalid_argument if the name is taken or is "__metadata__", or if the
  ///         tensor's byte count overflows (a broadcast view of 2^62 floats).
  template <class Scalar, std::size_t Rank>
  SafetensorsWriter& add(const std::string& name, TensorView<Scalar, Rank> tensor) {
    using S = std::remove_const_t<Scalar>;
    const std::vector<Index> shape(tensor.shape().begin(), tensor.shape().end());
    const std::size_t size = byte_count(name, dtype_of<S>(), shape);
    std::vector<unsigned char> bytes(size);
    unsigned char* out = bytes.data();
    const Scalar* in = tensor.data();
    attn::detail::for_each_offset(
        tensor.shape(), row_major_strides(tensor.shape()), tensor.strides(), [&](Index o, Index i) {
          unsigned char* dst = out + static_cast<std::size_t>(o) * sizeof(S);
          if constexpr (std::is_same_v<S, bool>) {
            *dst = in[i] ? 1 : 0;
          } else if constexpr (is_storage_type_v<S>) {
            detail::store_le<std::uint16_t>(in[i].bits(), dst);
          } else {
            detail::store_le<S>(in[i], dst);
          }
        });
    return add_raw(name, dtype_of<S>(), shape, std::move(bytes));
  }
  template <class Scalar, std::size_t Rank>
  SafetensorsWriter& add(const std::string& name, const Tensor<Scalar, Rank>& tensor) {
    return add(name, tensor.view());
  }

  /// Adds a tensor from raw little-endian bytes.
  /// @throws std::invalid_argument if the name is taken, reserved or not UTF-8, an extent is
  ///         negative, the shape's byte count overflows, or bytes.size() is not shape x
  ///         dtype_size(dtype).
  SafetensorsWriter& add_raw(const std::string& name, DType dtype, std::vector<Index> shape,
                             std::vector<unsigned char> bytes) {
    const std::size_t size = byte_count(name, dtype, shape);
    detail::io_require<std::invalid_argument>(size == bytes.size(), kWhere, [&] {
      return "tensor '" + name + "' (" + dtype_name(dtype) + ", shape " +
             detail::shape_text(shape) + ") needs " + std::to_string(size) + " bytes, got " +
             std::to_string(bytes.size());
    });
    entries_.emplace(name, Entry{dtype, std::move(shape), std::move(bytes)});
    return *this;
  }

  /// Sets a "__metadata__" string entry.
  /// @throws std::invalid_argument if the key or the value is not valid UTF-8.
  SafetensorsWriter& set_metadata(const std::string& key, const std::string& value) {
    detail::io_require<std::invalid_argument>(
        detail::is_utf8(key) && detail::is_utf8(value), "SafetensorsWriter::set_metadata",
        [] { return std::string("metadata keys and values must be valid UTF-8 (JSON strings)"); });
    metadata_[key] = value;
    return *this;
  }

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::size_t size() const noexcept { return entries_.size(); }

  /// The file's bytes.
  std::vector<unsigned char> to_bytes() const {
    std::vector<const std::pair<const std::string, Entry>*> order;
    for (const auto& entry : entries_) order.push_back(&entry);
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
      return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
    });
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::size_t offset = 0;
    for (const auto* entry : order) {
      const Entry& e = entry->second;
      header[entry->first] = {{"dtype", dtype_name(e.dtype)},
                              {"shape", e.shape},
                              {"data_offsets", {offset, offset + e.bytes.size()}}};
      offset += e.bytes.size();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::vector<unsigned char> out(8 + text.size() + offset);
    detail::store_le<std::uint64_t>(text.size(), out.data());
    std::memcpy(out.data() + 8, text.data(), text.size());
    unsigned char* data = out.data() + 8 + text.size();
    for (const auto* entry : order) {
      const auto& bytes = entry->second.bytes;
      if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
      data += bytes.size();
    }
    return out;
  }

  /// Writes the file to `path`, atomically: to a temporary file in the same directory,
  /// flushed to the device (fsync), then renamed over `path`. If anything fails (disk full,
  /// a file size limit, a directory that cannot be written) `path` keeps its old contents
  /// and the temporary file is removed. An existing file's permission bits are kept; a
  /// symbolic link at `path` is replaced by the file, not followed. Only a regular file (or
  /// nothing, or a link to either) is replaced: a directory, FIFO, socket or device at
  /// `path`, or a link to one, is refused before anything is written (and again just before
  /// the rename), so it is never clobbered. A process killed while
  /// saving (including by SIGXFSZ, which a file size limit raises unless it is ignored)
  /// leaves `path` intact but the temporary file behind.
  /// @throws IoError if it cannot be written, or `path` is not a regular file.
  void save(const std::string& path) const {
    const std::vector<unsigned char> bytes = to_bytes();
    detail::AtomicFile file(path, "SafetensorsWriter::save");
    file.commit(bytes.data(), bytes.size());
  }

 private:
  static constexpr const char* kWhere = "SafetensorsWriter::add";

  /// Checks the name and shape; returns shape x dtype size in bytes.
  std::size_t byte_count(const std::string& name, DType dtype,
                         const std::vector<Index>& shape) const {
    detail::io_require<std::invalid_argument>(name != "__metadata__", kWhere, [] {
      return std::string("the name __metadata__ is reserved by the format");
    });
    detail::io_require<std::invalid_argument>(entries_.count(name) == 0, kWhere, [&] {
      return "tensor '" + name + "' was already added";
    });
    detail::io_require<std::invalid_argument>(detail::is_utf8(name), kWhere, [] {
      return std::string("a tensor name must be valid UTF-8 (a JSON string)");
    });
    for (const Index e : shape) {
      detail::io_require<std::invalid_argument>(e >= 0, kWhere, [&] {
        return "tensor '" + name + "' has negative extent in shape " + detail::shape_text(shape);
      });
    }
    Index count = 0;
    std::size_t bytes = 0;
    const bool fits =
        attn::detail::checked_extent_product(shape, count) &&
        attn::detail::checked_bytes(static_cast<std::size_t>(count), dtype_size(dtype), bytes);
    detail::io_require<std::invalid_argument>(fits, kWhere, [&] {
      return "tensor '" + name + "' (" + dtype_name(dtype) + ", shape " +
             detail::shape_text(shape) + ") has a byte count that overflows";
    });
    return bytes;
  }

  struct Entry {
    DType dtype;
    std::vector<Index> shape;
    std::vector<unsigned char> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace io
ATTN_NAMESPACE_END
