// SPDX-License-Identifier: MIT
// attn/io/reader.hpp: SafetensorsFile, a validated safetensors file (memory-mapped, read from
// a stream or held in memory) whose tensors are converted on demand.
#pragma once

#include <algorithm>
#include <cstddef>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/io/detail/convert.hpp"
#include "attn/io/detail/file.hpp"
#include "attn/io/detail/header.hpp"
#include "attn/io/detail/json.hpp"
#include "attn/io/dtype.hpp"
#include "attn/io/error.hpp"
#include "attn/io/tensor_info.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// A safetensors file: an 8-byte little-endian header length N, N bytes of JSON
/// (`{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {"key": "value"}}`), then the tensors' raw little-endian bytes.
///
/// The whole file is validated when it is opened: the header length (at most 100 MB and
/// within the file), the JSON (nested at most 8 deep, checked on the raw text before it is
/// parsed; parsed by nlohmann::json; an object; no key given twice), every entry's dtype,
/// shape (non-negative, no overflow) and offsets (in range, byte count equal to shape x
/// dtype size), and that the tensors tile the data section exactly (no overlap, no gap,
/// nothing left over). Any violation throws FormatError naming the file, the tensor and the
/// values; nothing is read out of bounds. Tensors are then decoded on demand by get(), which
/// converts F16/BF16/F32/F64 (and integers) to float or double, BOOL (and integers,
/// nonzero = true) to bool, and F16/BF16/F32/F64 to bfloat16 or float16: BF16 to bfloat16
/// (F16 to float16) bit for bit, any other floating dtype rounded once to nearest even.
///
/// open() memory-maps the file (ATTN_IO_HAS_MMAP, the default on POSIX systems) or streams
/// it into memory. Copies share the bytes, which live until the last copy is destroyed. A
/// mapped file truncated by another process raises SIGBUS, as for any mapping.
class SafetensorsFile {
 public:
  /// An empty file (no tensors).
  SafetensorsFile() = default;

  /// Opens and validates `path`.
  /// @throws IoError if it cannot be opened or is not a regular file (a directory, a FIFO, a
  ///         device: rejected at once, never waited on); FormatError if it is malformed.
  static SafetensorsFile open(const std::string& path) {
    return from_storage(detail::read_file(path, "SafetensorsFile::open"), path);
  }

  /// Validates a file held in memory (takes ownership of the bytes).
  /// @param source  how messages name the buffer.
  /// @throws FormatError if it is malformed.
  static SafetensorsFile from_bytes(std::vector<unsigned char> bytes,
                                    std::string source = "<buffer>") {
    return from_storage(std::make_shared<detail::BufferStorage>(std::move(bytes)),
                        std::move(source));
  }

  /// Copies `size` bytes at `data` and validates them.
  static SafetensorsFile from_bytes(const void* data, std::size_t size,
                                    std::string source = "<buffer>") {
    const auto* p = static_cast<const unsigned char*>(data);
    return from_bytes(std::vector<unsigned char>(p, p + size), std::move(source));
  }

  /// Reads a whole stream (e.g. a pipe) into memory and validates it.
  static SafetensorsFile from_stream(std::istream& in, std::string source = "<stream>") {
    std::vector<unsigned char> bytes =
        detail::read_stream(in, source, "SafetensorsFile::from_stream");
    return from_bytes(std::move(bytes), std::move(source));
  }

  /// How messages name this file (its path, or "<buffer>").
  const std::string& source() const noexcept { return source_; }

  /// The tensor names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& entry : tensors_) out.push_back(entry.first);
    return out;
  }
  std::size_t size() const noexcept { return tensors_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  /// The "__metadata__" string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

  /// @throws FormatError if there is no tensor `name`.
  const TensorInfo& info(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw FormatError(missing_message(name));
    return it->second;
  }
  const std::vector<Index>& shape(const std::string& name) const { return info(name).shape; }
  DType dtype(const std::string& name) const { return info(name).dtype; }
  std::size_t rank(const std::string& name) const { return info(name).shape.size(); }

  /// The raw little-endian bytes of tensor `name` (info(name).end - begin bytes; any alignment).
  const unsigned char* raw_data(const std::string& name) const {
    return data_begin() + info(name).begin;
  }

  /// Tensor `name` converted to Scalar (float, double, bfloat16, float16 or bool). BF16 read
  /// as bfloat16 (F16 as float16) is copied bit for bit; F32 or F64 read as bfloat16 rounds
  /// each element once, to nearest even (attn::convert's rule); widening is exact.
  /// @throws FormatError if it is missing, its rank is not Rank, or its dtype does not
  ///         convert (float types to bool, BOOL to float, F8 formats, integers to bfloat16 or
  ///         float16).
  /// Shapes: as stored; a rank-0 tensor is read with Rank 1 as shape (1).
  template <class Scalar, std::size_t Rank>
  Tensor<Scalar, Rank> get(const std::string& name) const {
    const TensorInfo& entry = info(name);
    Shape<Rank> shape{};
    const bool scalar_as_vector = Rank == 1 && entry.shape.empty();
    detail::io_require<FormatError>(
        entry.shape.size() == Rank || scalar_as_vector, "SafetensorsFile::get", [&] {
          return where(name) + " has rank " + std::to_string(entry.shape.size()) + " (shape " +
                 detail::shape_text(entry.shape) + "), requested rank " + std::to_string(Rank);
        });
    if (scalar_as_vector) {
      shape[0] = 1;
    } else {
      std::copy(entry.shape.begin(), entry.shape.end(), shape.begin());
    }
    Tensor<Scalar, Rank> out(shape);
    convert(name, entry, out.data());
    return out;
  }

  /// The elements of tensor `name` (any rank) in row-major order, converted to Scalar.
  template <class Scalar>
  std::vector<Scalar> values(const std::string& name) const {
    const TensorInfo& entry = info(name);
    std::vector<Scalar> out(static_cast<std::size_t>(entry.numel()));
    if constexpr (std::is_same_v<Scalar, bool>) {
      // std::vector<bool> has no data(): convert through a byte buffer.
      std::unique_ptr<bool[]> tmp(new bool[out.size()]);
      convert(name, entry, tmp.get());
      std::copy(tmp.get(), tmp.get() + out.size(), out.begin());
    } else {
      convert(name, entry, out.data());
    }
    return out;
  }

 private:
  static SafetensorsFile from_storage(std::shared_ptr<const detail::Storage> storage,
                                      std::string source) {
    SafetensorsFile file;
    file.storage_ = std::move(storage);
    file.source_ = std::move(source);
    detail::Header header =
        detail::HeaderParser(file.source_).parse(file.storage_->data(), file.storage_->size());
    file.header_bytes_ = header.header_bytes;
    file.tensors_ = std::move(header.tensors);
    file.metadata_ = std::move(header.metadata);
    return file;
  }

  std::string where(const std::string& name) const {
    return "'" + source_ + "': tensor '" + name + "'";
  }
  std::string missing_message(const std::string& name) const {
    std::string text = "attn::io::SafetensorsFile: '" + source_ + "' has no tensor '" + name +
                       "'; it has " + std::to_string(tensors_.size()) + " tensor(s)";
    std::size_t listed = 0;
    for (const auto& entry : tensors_) {
      text += (listed == 0 ? ": " : ", ") + entry.first;
      if (++listed == 8) {
        if (tensors_.size() > 8) text += ", ...";
        break;
      }
    }
    return text;
  }
  const unsigned char* data_begin() const noexcept { return storage_->data() + 8 + header_bytes_; }

  template <class Scalar>
  static std::string type_name() {
    if constexpr (std::is_same_v<Scalar, bool>) {
      return "bool";
    } else {
      return element_name<Scalar>();
    }
  }

  template <class Scalar>
  void convert(const std::string& name, const TensorInfo& entry, Scalar* out) const {
    const char* why = detail::convert_elements(entry.dtype, data_begin() + entry.begin,
                                               static_cast<std::size_t>(entry.numel()), out);
    if (why != nullptr) {
      throw FormatError("attn::io::SafetensorsFile::get: " + where(name) + " has dtype " +
                        dtype_name(entry.dtype) + ", which cannot be read as " +
                        type_name<Scalar>() + why);
    }
  }

  std::shared_ptr<const detail::Storage> storage_ =
      std::make_shared<detail::BufferStorage>(std::vector<unsigned char>{});
  std::string source_ = "<empty>";
  std::size_t header_bytes_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace io
ATTN_NAMESPACE_END
