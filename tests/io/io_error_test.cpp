// SPDX-License-Identifier: MIT
// tests/io/io_error_test.cpp: attn::io's exceptions are attn::Errors (and std::runtime_errors),
// so `catch (const attn::Error&)` catches anything attn threw, io included.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace io_error_test {

namespace {

// Runs f; true when it threw an exception caught both as attn::Error and as Std, whose
// what() names attn::io.
template <class Std, class F>
::testing::AssertionResult throws_attn_error(F&& f) {
  try {
    f();
  } catch (const attn::Error& e) {
    if (dynamic_cast<const Std*>(&e) == nullptr) {
      return ::testing::AssertionFailure() << "an attn::Error of the wrong standard kind";
    }
    if (std::string(e.what()).find("attn::io::") == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not name attn::io: " << e.what();
    }
    return ::testing::AssertionSuccess();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is not an attn::Error";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

TEST(IoErrorTypes, EveryKindIsCaughtAsAttnError) {
  // IoError: a file that cannot be opened.
  EXPECT_TRUE((throws_attn_error<std::runtime_error>(
      [] { attn::io::SafetensorsFile::open("/nonexistent/attn/file.safetensors"); })));
  // FormatError: a header length past the end of the buffer.
  EXPECT_TRUE((throws_attn_error<attn::io::FormatError>([] {
    const std::vector<unsigned char> bytes = {0xff, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    attn::io::SafetensorsFile::from_bytes(bytes);
  })));
  // StateDictError: an empty file for a module with parameters (strict loading).
  EXPECT_TRUE((throws_attn_error<attn::io::StateDictError>([] {
    attn::MultiHeadAttention<float> mha(attn::MultiHeadAttentionOptions::pytorch(4, 2));
    attn::io::load_state_dict(mha, attn::io::SafetensorsFile());
  })));
}

}  // namespace

}  // namespace io_error_test

#include "support/bodies_end.hpp"
