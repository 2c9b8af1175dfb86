// SPDX-License-Identifier: MIT
// attn/version.hpp: library version (CMake parses these three lines).
#pragma once

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 2
#define ATTN_VERSION_PATCH 0

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN

/// The library version as "major.minor.patch".
inline constexpr const char* version() noexcept { return "0.2.0"; }

ATTN_NAMESPACE_END
