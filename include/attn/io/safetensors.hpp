// SPDX-License-Identifier: MIT
// attn/io/safetensors.hpp: the safetensors format: dtypes, the reader (SafetensorsFile) and
// the writer (SafetensorsWriter).
#pragma once

#include "attn/io/dtype.hpp"
#include "attn/io/error.hpp"
#include "attn/io/reader.hpp"
#include "attn/io/tensor_info.hpp"
#include "attn/io/writer.hpp"
