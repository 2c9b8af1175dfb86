// SPDX-License-Identifier: MIT
// fuzz/targets.hpp: the fuzz targets' entry points, one namespace per target. They are
// linked into one program, attn_fuzz, compiled as one unit (they instantiate mostly the same
// attn code), which runs the target it is started as: build/.../fuzz/<target> is a symlink
// to it (fuzz/main.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn_run_fuzz {
int test_one_input(const std::uint8_t* data, std::size_t size);
}
namespace safetensors_fuzz {
int test_one_input(const std::uint8_t* data, std::size_t size);
}
namespace training_fuzz {
int test_one_input(const std::uint8_t* data, std::size_t size);
}
namespace mask_api_fuzz {
int test_one_input(const std::uint8_t* data, std::size_t size);
}
namespace kv_cache_fuzz {
int test_one_input(const std::uint8_t* data, std::size_t size);
}
