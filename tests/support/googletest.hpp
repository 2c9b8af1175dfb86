// SPDX-License-Identifier: MIT
// support/googletest.hpp: GoogleTest and GoogleMock for the shared precompiled header, their
// templates compiled without optimisation under GCC (as support/bodies_begin.hpp does for the
// test bodies): the registration of every typed and parameterised test, the assertion
// helpers and the matchers. Included after attn and Eigen, so that the standard headers they
// use keep the build's level. (A template is compiled with the options in force where it is
// defined, and GCC keeps them in the precompiled header.)
#pragma once

#if ATTN_TEST_UNOPTIMIZED_BODIES && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O0")
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#pragma GCC pop_options
#else
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#endif
