// SPDX-License-Identifier: MIT
// support/thrown.hpp: the message of an expected exception, for EXPECT_THAT with a string
// matcher: EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { ... }), HasSubstr("(2, 3)")).
#pragma once

#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <typeinfo>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif

#include <gtest/gtest.h>

namespace attn::test {

/// The readable name of a type (demangled where the C++ ABI library can).
inline std::string type_name(const std::type_info& type) {
#if __has_include(<cxxabi.h>)
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  if (status == 0 && name != nullptr) {
    std::string text = name;
    std::free(name);
    return text;
  }
#endif
  return type.name();
}

/// What `call` threw as an E (its what()). Throwing nothing, or an exception that is not an
/// E, is a test failure, and the returned text says what happened instead. One function for
/// every call site: gtest's ThrowsMessage<E> matcher is instantiated once per lambda, and its
/// ~400 instances were 6.5 % of the compiled test code.
template <class E>
std::string thrown(const std::function<void()>& call) {
  try {
    call();
  } catch (const E& error) {
    return error.what();
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", caught " << type_name(typeid(other))
                  << ": " << other.what();
    return "(caught " + type_name(typeid(other)) + ": " + other.what() + ")";
  } catch (...) {
    ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", caught a non-std exception";
    return "(caught a non-std exception)";
  }
  ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", nothing was thrown";
  return "(nothing thrown)";
}

}  // namespace attn::test
