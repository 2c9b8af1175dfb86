// SPDX-License-Identifier: MIT
// attn/detail/eigen_core.hpp: <Eigen/Core>, included after attn/config.hpp so that GCC 12's
// AVX-512 intrinsic headers are read with its false -Wmaybe-uninitialized positives off
// (see config.hpp). attn's headers include Eigen through this one.
#pragma once

// clang-format off
#include "attn/config.hpp"
#include <Eigen/Core>
// clang-format on
