// SPDX-License-Identifier: MIT
// tests/codegen/prefetch_kept.cpp: the software prefetches of a decode pass survive the
// optimiser. Compiled to assembly by tests/codegen/prefetch_kept.cmake, once per probe
// (ATTN_PROBE), which fails unless the probe's code holds a prefetch instruction. GCC 12
// deleted the calls of an inline function whose only effect is __builtin_prefetch once it knew
// their bounds (probe 1 asked for nothing without the guard in detail::prefetch_line()), and
// nothing else shows it: the results are the same, only slower.
#include "attn/kernels/prefetch.hpp"

using attn::Index;
namespace detail = attn::detail;

#if ATTN_PROBE == 1
// Requests built key by key, the row bytes known (hd 128 int8): the form whose requests GCC 12
// deleted.
float probe(const unsigned char* k, const float* x, Index n) {
  detail::KeyPrefetch ahead;
  ahead.k_bytes = 128;
  float s = 0.0f;
  for (Index j = 0; j < n; ++j) {
    detail::KeyRequests(ahead, k, 128)(j);
    s += x[j];
  }
  return s;
}
#elif ATTN_PROBE == 2
// A pass binding KeyRequests once: rows key by key, scales once per 4 keys.
float probe(const detail::KeyPrefetch& ahead, const unsigned char* k, const float* x, Index n) {
  const detail::KeyRequests requests(ahead, k, 64);
  float s = 0.0f;
  for (Index j = 0; j < n; ++j) {
    requests(j);
    if (j % 4 == 0) requests.scales(j);
    s += x[j];
  }
  return s;
}
#elif ATTN_PROBE == 3
// One line, its address known up to the loop's index.
float probe(const float* x, Index n) {
  float s = 0.0f;
  for (Index j = 0; j < n; ++j) {
    detail::prefetch_line(reinterpret_cast<std::uintptr_t>(x + 64 * j));
    s += x[j];
  }
  return s;
}
#else
#error "define ATTN_PROBE to 1, 2 or 3"
#endif
