// SPDX-License-Identifier: MIT
// tests/support/pch_anchor.cpp: the translation unit that builds the tests' shared
// precompiled header (see tests/CMakeLists.txt); it has no code of its own.
