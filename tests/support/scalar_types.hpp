// SPDX-License-Identifier: MIT
// tests/support/scalar_types.hpp: the float/double sweep for TYPED_TEST_SUITE, with readable
// names (Suite/float.Test instead of Suite/0.Test).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <type_traits>

namespace attn::test {

using ScalarTypes = ::testing::Types<float, double>;

struct ScalarTypeNames {
  template <class T>
  static std::string GetName(int /*index*/) {
    return std::is_same_v<T, float> ? "float" : "double";
  }
};

}  // namespace attn::test
