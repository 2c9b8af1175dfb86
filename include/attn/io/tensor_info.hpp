// SPDX-License-Identifier: MIT
// attn/io/tensor_info.hpp: what a safetensors header says about one tensor (dtype, shape and
// byte range).
#pragma once

#include <cstddef>
#include <vector>

#include "attn/config.hpp"
#include "attn/io/dtype.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// Dtype, shape and byte range of one tensor in a safetensors file.
struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<Index> shape;
  std::size_t begin = 0;  ///< byte offset in the data section
  std::size_t end = 0;    ///< one past the last byte in the data section
  /// Number of elements (validated not to overflow when the file was opened).
  Index numel() const noexcept {
    Index n = 1;
    for (const Index e : shape) n = e == 0 ? 0 : n * e;
    return n;
  }
};

}  // namespace io
ATTN_NAMESPACE_END
