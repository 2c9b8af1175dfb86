// SPDX-License-Identifier: MIT
// tests/perf/zero_alloc_test.cpp: after one warm-up call with the same shapes and the same
// Workspace, the forward passes make no heap allocation, with 1 and 2 threads.
//
// This executable replaces the global operator new/delete (every form: plain, array,
// nothrow, aligned, sized) with counting versions. Eigen allocates through std::malloc,
// not operator new, so the malloc family is counted too: in a plain build by interposing
// malloc/calloc/realloc/aligned_alloc/posix_memalign/memalign (forwarding to glibc's
// __libc_* entry points), under AddressSanitizer (which owns malloc) through its
// malloc hook. Allocations on every thread count, including OpenMP workers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/detail/eigen_core.hpp"  // Eigen after attn/config.hpp (GCC 12 AVX-512 warnings)
#include "support/test_support.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_TEST_ASAN 1
#endif
#endif
#ifndef ATTN_TEST_ASAN
#define ATTN_TEST_ASAN 0
#endif

// LLVM's OpenMP runtime (libomp: clang's -fopenmp, the sanitizer tree) mallocs inside its
// parallel regions: about 25 calls (24 KiB) in two forward calls on 2 threads, none of them
// attn's. Its multi-thread malloc counts are therefore not attn's; GCC's libgomp (the release
// tree) makes none, and there every count is checked.
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC
#if defined(KMP_VERSION_MAJOR)
#define ATTN_TEST_OPENMP_MALLOCS 1
#else
#define ATTN_TEST_OPENMP_MALLOCS 0
#endif

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_new_calls{0};
std::atomic<long> g_malloc_calls{0};
std::atomic<long> g_malloc_bytes{0};

void note_new() noexcept {
  if (g_counting.load(std::memory_order_relaxed))
    g_new_calls.fetch_add(1, std::memory_order_relaxed);
}
void note_malloc(std::size_t bytes) noexcept {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
    g_malloc_bytes.fetch_add(static_cast<long>(bytes), std::memory_order_relaxed);
  }
}

void* allocate(std::size_t size) {
  note_new();
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* allocate_aligned(std::size_t size, std::align_val_t align) {
  note_new();
  const auto a = static_cast<std::size_t>(align);
  const std::size_t rounded = (size + a - 1) / a * a;
  void* p = std::aligned_alloc(a, rounded == 0 ? a : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// ---- the replaced global allocation functions ----
void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t align) {
  return allocate_aligned(size, align);
}
void* operator new[](std::size_t size, std::align_val_t align) {
  return allocate_aligned(size, align);
}
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return allocate_aligned(size, align);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return allocate_aligned(size, align);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

// ---- the malloc family ----
#if ATTN_TEST_ASAN
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             std::size_t),
                                                         void (*free_hook)(const volatile void*));
namespace {
void asan_malloc_hook(const volatile void*, std::size_t size) { note_malloc(size); }
void asan_free_hook(const volatile void*) {}
const int kHooksInstalled =
    __sanitizer_install_malloc_and_free_hooks(asan_malloc_hook, asan_free_hook);
}  // namespace
#else
extern "C" {
void* __libc_malloc(std::size_t) noexcept;
void __libc_free(void*) noexcept;
void* __libc_calloc(std::size_t, std::size_t) noexcept;
void* __libc_realloc(void*, std::size_t) noexcept;
void* __libc_memalign(std::size_t, std::size_t) noexcept;

void* malloc(std::size_t size) noexcept {
  note_malloc(size);
  return __libc_malloc(size);
}
void free(void* p) noexcept { __libc_free(p); }
void* calloc(std::size_t count, std::size_t size) noexcept {
  note_malloc(count * size);
  return __libc_calloc(count, size);
}
void* realloc(void* p, std::size_t size) noexcept {
  note_malloc(size);
  return __libc_realloc(p, size);
}
void* memalign(std::size_t align, std::size_t size) noexcept {
  note_malloc(size);
  return __libc_memalign(align, size);
}
void* aligned_alloc(std::size_t align, std::size_t size) noexcept {
  note_malloc(size);
  return __libc_memalign(align, size);
}
int posix_memalign(void** out, std::size_t align, std::size_t size) noexcept {
  note_malloc(size);
  void* p = __libc_memalign(align, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}  // extern "C"
namespace {
const int kHooksInstalled = 1;
}  // namespace
#endif

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::Index;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

struct Counts {
  long news = 0, mallocs = 0, malloc_bytes = 0;
};

template <class Fn>
Counts count_allocations(Fn&& fn) {
  g_new_calls = 0;
  g_malloc_calls = 0;
  g_malloc_bytes = 0;
  g_counting = true;
  fn();
  g_counting = false;
  return {g_new_calls.load(), g_malloc_calls.load(), g_malloc_bytes.load()};
}

/// Restores the thread count when the test ends.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(attn::num_threads()) {}
  ~ThreadCountGuard() { attn::set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

/// For 1 and 2 threads: one warm-up call, then two counted calls that must not allocate.
template <class Fn>
void expect_steady_state_without_allocation(Fn&& call) {
  ThreadCountGuard guard;
  for (const int threads : {1, 2}) {
    attn::set_num_threads(threads);
    call();  // warm-up: workspace buffers grow, OpenMP starts its threads
    const Counts counts = count_allocations([&] {
      call();
      call();
    });
    EXPECT_EQ(counts.news, 0) << threads
                              << " thread(s): operator new calls in two steady-state calls";
    if (ATTN_TEST_OPENMP_MALLOCS && threads > 1) continue;  // the runtime's, see above
    EXPECT_EQ(counts.mallocs, 0) << threads
                                 << " thread(s): malloc-family calls in two steady-state calls ("
                                 << counts.malloc_bytes << " bytes)";
  }
}

// A shape big enough to matter: B=2, T=256, D=128, H=4 (key/value of cross-attention: 200).
// Under AddressSanitizer, where the kernels run several times slower, T=160, D=64 (still
// several query tiles and key blocks).
#if !ATTN_TEST_ASAN
constexpr Index kBatch = 2, kTokens = 256, kDim = 128, kHeads = 4, kKeyTokens = 200;
#else
constexpr Index kBatch = 2, kTokens = 160, kDim = 64, kHeads = 4, kKeyTokens = 140;
#endif

TEST(ZeroAllocation, CountersSeeEveryKindOfAllocation) {
  // The instrumentation itself: without it every test below would pass trivially.
  ASSERT_NE(kHooksInstalled, 0);
  Counts c = count_allocations([] { delete new int(1); });
  EXPECT_EQ(c.news, 1);
  c = count_allocations([] { const std::vector<float> v(1000); });
  EXPECT_EQ(c.news, 1);
  c = count_allocations([] { const Tensor<float, 2> t({64, 64}); });  // aligned operator new
  EXPECT_EQ(c.news, 1);
  c = count_allocations([] {
    Eigen::MatrixXf m(300, 300);  // Eigen's aligned_malloc -> std::malloc
    m.setZero();
  });
  EXPECT_GE(c.mallocs, 1);
  c = count_allocations([] { std::free(std::malloc(100)); });
  EXPECT_EQ(c.mallocs, 1);
  // Allocations on OpenMP worker threads count too (the first region starts the team).
  ThreadCountGuard guard;
  attn::set_num_threads(2);
  const auto two_threads_allocate = [] {
#if ATTN_HAS_OPENMP
#pragma omp parallel num_threads(2)
    { std::free(std::malloc(64)); }
#else
    std::free(std::malloc(64));
    std::free(std::malloc(64));
#endif
  };
  two_threads_allocate();
  c = count_allocations(two_threads_allocate);
  EXPECT_EQ(c.mallocs, 2);
}

template <class Scalar>
class ZeroAllocation : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ZeroAllocation, Scalars, );

TYPED_TEST(ZeroAllocation, MultiHeadSelfAttentionForward) {
  using Scalar = TypeParam;
  attn::manual_seed(1);
  MultiHeadAttention<Scalar> mha(kDim, kDim, kTokens, /*dropout=*/0.1, kHeads, /*qkv_bias=*/true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 2);
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim});
  attn::Workspace ws;
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training ? "train (dropout 0.1)" : "eval");
    mha.train(training);
    expect_steady_state_without_allocation([&] { mha.forward(x.view(), out.view(), ws); });
  }
  SCOPED_TRACE("frozen (weights packed once)");
  mha.eval();
  mha.freeze();
  expect_steady_state_without_allocation([&] { mha.forward(x.view(), out.view(), ws); });
}

// A decoding step through a KV cache: grouped-query heads, rotary embeddings, frozen weights;
// a cache with ragged lengths (K/V go through the workspace) and a sliding-window ring that
// wraps (K/V straight into the cache), over more than one 512-key chunk.
TYPED_TEST(ZeroAllocation, DecodeStepThroughAKeyValueCache) {
  using Scalar = TypeParam;
  attn::MultiHeadAttentionOptions o;
  o.d_in = kDim;
  o.num_heads = kHeads;
  o.num_kv_heads = kHeads / 2;
  o.causal = true;
  o.qkv_bias = true;
  o.rope = attn::RotaryOptions{kDim / kHeads, 0, 10000.0, attn::RopeStyle::kHalfSplit, 4096};
  for (const Index window : {Index(0), Index(600)}) {
    SCOPED_TRACE("window " + std::to_string(window));
    o.sliding_window = window;
    attn::manual_seed(1);
    MultiHeadAttention<Scalar> mha(o);
    mha.eval();
    mha.freeze();
    const Index hd = kDim / kHeads, prompt = 1030;
    attn::KVCache<Scalar> cache =
        window > 0 ? attn::KVCache<Scalar>::sliding_window(kBatch, kHeads / 2, hd, window, 64)
                   : attn::KVCache<Scalar>(kBatch, kHeads / 2, hd, 2048);
    attn::Workspace ws;
    const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, prompt, kDim}, 3);
    Tensor<Scalar, 3> y({kBatch, prompt, kDim});
    mha.forward(x.view(), y.view(), ws, cache);
    if (window == 0) cache.truncate(1, prompt - 7);  // ragged
    const auto token = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, 1, kDim}, 4);
    Tensor<Scalar, 3> out({kBatch, 1, kDim});
    expect_steady_state_without_allocation(
        [&] { mha.forward(token.view(), out.view(), ws, cache); });
  }
}

/// The float module of the cache tests below: GQA (H_kv = H / 2), causal, RoPE, frozen.
MultiHeadAttention<float> frozen_gqa_module() {
  attn::MultiHeadAttentionOptions o;
  o.d_in = kDim;
  o.num_heads = kHeads;
  o.num_kv_heads = kHeads / 2;
  o.causal = true;
  o.rope = attn::RotaryOptions{kDim / kHeads, 0, 10000.0, attn::RopeStyle::kHalfSplit, 4096};
  attn::manual_seed(1);
  MultiHeadAttention<float> mha(o);
  mha.eval();
  mha.freeze();
  return mha;
}

/// Steps of `step` (B, T, D) through caches holding the prompt x (B, L, D), each cache of room
/// `capacity`: a KVCache of each element type in `contiguous`, a PagedKVCache (16-token blocks,
/// B sequences read through their block tables) of each in `paged`. Each step appends T tokens,
/// then the cache is truncated back, so that every call meets the same cache (a step that
/// takes a new block may grow that sequence's table).
void expect_cache_steps_without_allocation(const MultiHeadAttention<float>& mha,
                                           const Tensor<float, 3>& x, const Tensor<float, 3>& step,
                                           Index capacity,
                                           std::initializer_list<attn::KVElement> contiguous,
                                           std::initializer_list<attn::KVElement> paged) {
  const Index hd = kDim / kHeads, prompt = x.extent(1);
  Tensor<float, 3> y({kBatch, prompt, kDim}), out({kBatch, step.extent(1), kDim});
  attn::Workspace ws;
  for (const attn::KVElement element : contiguous) {
    SCOPED_TRACE(std::string("contiguous ") + attn::kv_element_name(element));
    attn::KVCacheOptions co;
    co.batch = kBatch, co.num_kv_heads = kHeads / 2, co.head_dim = hd, co.capacity = capacity;
    co.element = element;
    attn::KVCache<float> cache(co);
    mha.forward(x.view(), y.view(), ws, cache);
    expect_steady_state_without_allocation([&] {
      mha.forward(step.view(), out.view(), ws, cache);
      for (Index b = 0; b < kBatch; ++b) cache.truncate(b, prompt);
    });
  }
  for (const attn::KVElement element : paged) {
    SCOPED_TRACE(std::string("paged ") + attn::kv_element_name(element));
    attn::PagedKVCacheOptions po;
    po.num_blocks = 2 * kBatch * capacity / 16, po.block_size = 16;
    po.num_kv_heads = kHeads / 2, po.head_dim = hd, po.element = element;
    attn::PagedKVCache<float> cache(po);
    std::vector<Index> seqs;
    for (Index b = 0; b < kBatch; ++b) seqs.push_back(cache.add_sequence());
    mha.forward(x.view(), y.view(), ws, cache, seqs);
    expect_steady_state_without_allocation([&] {
      mha.forward(step.view(), out.view(), ws, cache, seqs);
      for (const Index s : seqs) cache.truncate(s, prompt);
    });
  }
}

// Decoding steps through caches of quantised rows (int8, int4: the query quantised and the
// rows read in place) and through paged caches (float and int4 rows).
TEST(ZeroAllocation, DecodeStepsThroughQuantizedAndPagedCaches) {
  const MultiHeadAttention<float> mha = frozen_gqa_module();
  const auto x = attn::test::random_tensor<float>(Shape<3>{kBatch, 1030, kDim}, 3);
  const auto token = attn::test::random_tensor<float>(Shape<3>{kBatch, 1, kDim}, 4);
  expect_cache_steps_without_allocation(mha, x, token, 2048,
                                        {attn::KVElement::kInt8, attn::KVElement::kInt4},
                                        {attn::KVElement::kScalar, attn::KVElement::kInt4});
}

// Chunks of a chunked prefill (64 new tokens over a prompt) through a float, an int8 and a
// paged int4 cache, and a packed prefill of prompts of different lengths into a float cache
// and into a paged int4 one: the same steady state as a decoding step.
TEST(ZeroAllocation, PrefillChunksThroughCaches) {
  const MultiHeadAttention<float> mha = frozen_gqa_module();
  const auto x = attn::test::random_tensor<float>(Shape<3>{kBatch, 700, kDim}, 3);
  const auto chunk = attn::test::random_tensor<float>(Shape<3>{kBatch, 64, kDim}, 4);
  expect_cache_steps_without_allocation(mha, x, chunk, 1024,
                                        {attn::KVElement::kScalar, attn::KVElement::kInt8},
                                        {attn::KVElement::kInt4});
  SCOPED_TRACE("packed prompts of 40, 0 and 100 tokens into a float cache");
  attn::KVCache<float> cache(3, kHeads / 2, kDim / kHeads, 1024);
  const attn::PackedSequences packed(std::vector<Index>{0, 40, 40, 140});
  const auto prompts = attn::test::random_tensor<float>(Shape<2>{140, kDim}, 5);
  Tensor<float, 2> out({140, kDim});
  attn::Workspace ws;
  expect_steady_state_without_allocation([&] {
    mha.forward(prompts.view(), packed, out.view(), ws, cache);
    for (Index b = 0; b < 3; ++b) cache.truncate(b, 0);
  });
  SCOPED_TRACE("the same prompts into a paged int4 cache");
  attn::PagedKVCacheOptions po;
  po.num_blocks = 64, po.block_size = 16, po.num_kv_heads = kHeads / 2;
  po.head_dim = kDim / kHeads, po.element = attn::KVElement::kInt4;
  attn::PagedKVCache<float> paged(po);
  std::vector<Index> ids;
  for (Index b = 0; b < 3; ++b) ids.push_back(paged.add_sequence());
  expect_steady_state_without_allocation([&] {
    mha.forward(prompts.view(), packed, out.view(), ws, paged, ids);
    for (const Index s : ids) paged.truncate(s, 0);
  });
}

TYPED_TEST(ZeroAllocation, MultiHeadCrossAttentionForwardWithMask) {
  using Scalar = TypeParam;
  attn::TorchGenerator gen(3);
  const MultiHeadAttention<Scalar> mha(MultiHeadAttentionOptions::pytorch(kDim, kHeads), gen);
  const auto query = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 4);
  const auto key = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kKeyTokens, kDim}, 5);
  const auto value = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kKeyTokens, kDim}, 6);
  Tensor<bool, 2> padding({kBatch, kKeyTokens});
  for (Index j = kKeyTokens / 2; j < kKeyTokens; ++j) padding(1, j) = true;
  AttentionMask<Scalar> mask;  // built before the loop
  mask.key_padding(padding.view());
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim});
  attn::Workspace ws;
  {
    SCOPED_TRACE("key and value distinct");
    expect_steady_state_without_allocation(
        [&] { mha.forward(query.view(), key.view(), value.view(), out.view(), ws, mask); });
  }
  {
    SCOPED_TRACE("key is value");
    expect_steady_state_without_allocation(
        [&] { mha.forward(query.view(), key.view(), key.view(), out.view(), ws, mask); });
  }
  {
    SCOPED_TRACE("frozen, key and value distinct");
    MultiHeadAttention<Scalar> frozen = mha;
    frozen.freeze();
    expect_steady_state_without_allocation(
        [&] { frozen.forward(query.view(), key.view(), value.view(), out.view(), ws, mask); });
  }
}

TYPED_TEST(ZeroAllocation, CausalAttentionForward) {
  using Scalar = TypeParam;
  attn::manual_seed(7);
  const attn::CausalAttention<Scalar> ca(kDim, kDim, kTokens, 0.0);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 8);
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim});
  attn::Workspace ws;
  expect_steady_state_without_allocation([&] { ca.forward(x.view(), out.view(), ws); });
}

// The other modules share the same forward set (attn/attention/module.hpp): into `out`
// with a warm workspace, none allocates either, unbatched forms included.
TYPED_TEST(ZeroAllocation, EveryOtherModuleForward) {
  using Scalar = TypeParam;
  attn::manual_seed(12);
  const attn::SimpleSelfAttention<Scalar> simple;
  attn::SelfAttention<Scalar> sa(kDim, kDim, true);
  attn::MultiHeadAttentionWrapper<Scalar> wrapper(kDim, kDim / kHeads, kTokens, 0.1, kHeads);
  attn::CrossAttention<Scalar> cross(kDim, kDim / 2, kDim, kHeads, true);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 13);
  const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kKeyTokens, kDim / 2}, 14);
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim});
  Tensor<Scalar, 2> out2({kTokens, kDim});
  const auto x2 = attn::select(x.view(), 0, 0);
  attn::Workspace ws;
  expect_steady_state_without_allocation([&] { simple.forward(x.view(), out.view(), ws); });
  expect_steady_state_without_allocation([&] { sa.forward(x.view(), out.view(), ws); });
  expect_steady_state_without_allocation([&] { sa.forward(x2, out2.view(), ws); });
  expect_steady_state_without_allocation([&] { wrapper.forward(x.view(), out.view(), ws); });
  expect_steady_state_without_allocation(
      [&] { cross.forward(x.view(), kv.view(), out.view(), ws); });
  sa.freeze();
  cross.freeze();
  wrapper.eval();
  wrapper.freeze();
  expect_steady_state_without_allocation([&] { sa.forward(x.view(), out.view(), ws); });
  expect_steady_state_without_allocation([&] { wrapper.forward(x.view(), out.view(), ws); });
  expect_steady_state_without_allocation(
      [&] { cross.forward(x.view(), kv.view(), out.view(), ws); });
}

// A training forward records into a reused SavedForward: once warm it allocates nothing
// either (its buffers, the mask copy and the wrapper's per-head records are reused).
TYPED_TEST(ZeroAllocation, TrainingForwardWithSavedState) {
  using Scalar = TypeParam;
  attn::manual_seed(15);
  MultiHeadAttention<Scalar> mha(kDim, kDim, kTokens, /*dropout=*/0.1, kHeads, true);
  attn::MultiHeadAttentionWrapper<Scalar> wrapper(kDim, kDim / kHeads, kTokens, 0.1, kHeads);
  const attn::SimpleSelfAttention<Scalar> simple;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 16);
  Tensor<bool, 2> padding({kBatch, kTokens});
  padding(1, kTokens - 1) = true;
  AttentionMask<Scalar> mask;
  mask.key_padding(padding.view()).key_lengths({kTokens, kTokens - 3});
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim});
  attn::Workspace ws;
  attn::SavedForward<Scalar> saved;
  expect_steady_state_without_allocation(
      [&] { mha.forward(x.view(), out.view(), saved, ws, mask); });
  attn::SavedForward<Scalar> saved_heads;
  expect_steady_state_without_allocation(
      [&] { wrapper.forward(x.view(), out.view(), saved_heads, ws, mask); });
  expect_steady_state_without_allocation(
      [&] { simple.forward(x.view(), out.view(), saved, ws, mask); });
}

// A whole training step (training forward, zeroing, backward into the input and parameter
// gradients, an optimizer step) allocates nothing once warm: every module kind.
TYPED_TEST(ZeroAllocation, TrainingStepForwardBackwardAndAdamW) {
  using Scalar = TypeParam;
  attn::manual_seed(19);
  MultiHeadAttention<Scalar> mha(kDim, kDim, kTokens, /*dropout=*/0.1, kHeads, true);
  attn::MultiHeadAttentionWrapper<Scalar> wrapper(kDim, kDim / kHeads, kTokens, 0.1, kHeads);
  attn::CrossAttention<Scalar> cross(kDim, kDim / 2, kDim, kHeads, true);
  const attn::SimpleSelfAttention<Scalar> simple;
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 20);
  const auto kv = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kKeyTokens, kDim / 2}, 21);
  const auto grad_out = attn::test::random_tensor<Scalar>(Shape<3>{kBatch, kTokens, kDim}, 22);
  AttentionMask<Scalar> mask;
  mask.key_lengths({kTokens, kTokens - 3});
  AttentionMask<Scalar> cross_mask;
  cross_mask.key_lengths({kKeyTokens, kKeyTokens - 5});
  Tensor<Scalar, 3> out({kBatch, kTokens, kDim}), gx({kBatch, kTokens, kDim});
  Tensor<Scalar, 3> gkv({kBatch, kKeyTokens, kDim / 2});
  attn::Workspace ws;
  attn::SavedForward<Scalar> saved;
  attn::Gradients<Scalar> grads(mha.named_parameters());
  attn::optim::AdamW<Scalar> adamw(mha.named_parameters());
  expect_steady_state_without_allocation([&] {
    mha.forward(x.view(), out.view(), saved, ws, mask);
    grads.zero();
    gx.fill(Scalar(0));
    mha.backward(grad_out.view(), saved, gx.view(), grads, ws);
    adamw.step(grads);
  });
  attn::Gradients<Scalar> wrapper_grads(wrapper.named_parameters());
  expect_steady_state_without_allocation([&] {
    wrapper.forward(x.view(), out.view(), saved, ws, mask);
    wrapper.backward(grad_out.view(), saved, gx.view(), wrapper_grads, ws);
  });
  attn::Gradients<Scalar> cross_grads(cross.named_parameters());
  expect_steady_state_without_allocation([&] {
    cross.forward(x.view(), kv.view(), out.view(), saved, ws, cross_mask);
    cross.backward(grad_out.view(), saved, gx.view(), gkv.view(), cross_grads, ws);
  });
  attn::Gradients<Scalar> none(simple.named_parameters());
  expect_steady_state_without_allocation([&] {
    simple.forward(x.view(), out.view(), saved, ws, mask);
    simple.backward(grad_out.view(), saved, gx.view(), none, ws);
  });
}

// Optimizer steps allocate nothing: the state is allocated with the optimizer, and the
// gradients of a module (any naming, strided raw parameters included) are found by address.
TYPED_TEST(ZeroAllocation, OptimizerSteps) {
  using Scalar = TypeParam;
  attn::manual_seed(17);
  MultiHeadAttention<Scalar> mha(kDim, kDim, kTokens, 0.0, kHeads, true);
  attn::SelfAttention<Scalar> raw(kDim, kDim / 2, attn::kRandInit);
  attn::Gradients<Scalar> grads(mha.named_parameters());
  attn::Gradients<Scalar> raw_grads(raw.named_parameters());
  attn::optim::AdamWOptions adamw_options;
  adamw_options.amsgrad = true;
  attn::optim::AdamW<Scalar> adamw(mha.named_parameters(), adamw_options);
  attn::optim::SGDOptions sgd_options;
  sgd_options.lr = 0.01;
  sgd_options.momentum = 0.9;
  sgd_options.nesterov = true;
  sgd_options.weight_decay = 0.1;
  attn::optim::SGD<Scalar> sgd(raw.named_parameters(), sgd_options);
  grads.at("in_proj_weight").matrix()(0, 0) = Scalar(0.5);
  raw_grads.at("W_key").matrix()(1, 0) = Scalar(0.25);
  expect_steady_state_without_allocation([&] {
    adamw.step(grads);
    grads.zero();
  });
  expect_steady_state_without_allocation([&] { sgd.step(raw_grads); });
}

TYPED_TEST(ZeroAllocation, ScaledDotProductAttentionWithWorkspace) {
  using Scalar = TypeParam;
  const Index hd = kDim / kHeads;
  const auto q = attn::test::random_tensor<Scalar>(Shape<4>{kBatch, kHeads, kTokens, hd}, 9);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{kBatch, kHeads, kTokens, hd}, 10);
  const auto v = attn::test::random_tensor<Scalar>(Shape<4>{kBatch, kHeads, kTokens, hd}, 11);
  Tensor<Scalar, 4> out({kBatch, kHeads, kTokens, hd});
  AttentionMask<Scalar> mask;
  mask.causal();
  attn::Workspace ws;
  for (const AttentionPath path : {AttentionPath::kStreaming, AttentionPath::kMaterialized}) {
    SCOPED_TRACE(path == AttentionPath::kStreaming ? "streaming" : "materialized");
    AttentionOptions options;
    options.path = path;
    expect_steady_state_without_allocation([&] {
      attn::scaled_dot_product_attention<Scalar>(q.view(), k.view(), v.view(), out.view(), ws, mask,
                                                 options);
    });
  }
}

TYPED_TEST(ZeroAllocation, KVCacheStepsAndReorder) {
  // A generation step's cache work (append, in-place rows and advance, truncate, beam-search
  // reorder with repeats and a cycle, RoPE on the new rows) allocates nothing; the ring wraps.
  using Scalar = TypeParam;
  attn::KVCache<Scalar> cache = attn::KVCache<Scalar>::sliding_window(4, 2, 16, 8, 2);
  const attn::RotaryEmbedding<Scalar> rope(16, 4096);
  const auto k = attn::test::random_tensor<Scalar>(Shape<4>{4, 2, 2, 16}, 1);
  const std::vector<Index> beams{2, 2, 0, 1}, cycle{1, 2, 3, 0};
  Index step = 0;
  expect_steady_state_without_allocation([&] {
    for (int i = 0; i < 4; ++i, ++step) {
      cache.append(k.view(), k.view());
      rope.apply(cache.k_slot(0, 1, cache.length(0) - 1), 1, 16, cache.length(0) - 1);
      cache.truncate(3, cache.length(3) - 1);
      cache.reorder(step % 2 == 0 ? beams : cycle);
    }
  });
  attn::KVCache<Scalar> linear(2, 2, 16, 4096);
  expect_steady_state_without_allocation([&] {
    const TensorView<Scalar, 4> rows = linear.next_rows(1);
    rows(1, 3, 0, 5) = Scalar(1);
    linear.advance(1);
  });
}

// The GEMM on bfloat16 operands (float results), B packed per call and once, on every path
// this CPU has (the avx512 set's AMX and dot product, and widening everywhere): the
// workspace's buffers, sized by the warm-up, serve every later call.
TEST(ZeroAllocation, BFloat16GemmWithWorkspace) {
  const Index m = 200, n = 300, k = 257;  // 31 MFLOP: above the threshold for threads
  const auto fa = attn::test::random_tensor<float, 2>({m, k}, 3);
  const auto fb = attn::test::random_tensor<float, 2>({n, k}, 4);
  const auto a = attn::convert<attn::bfloat16>(fa);
  const auto b = attn::convert<attn::bfloat16>(fb);
  const auto bias = attn::test::random_tensor<float, 1>({n}, 5);
  Tensor<float, 2> c({m, n});
  for (const attn::Bf16Path path :
       {attn::Bf16Path::kAmx, attn::Bf16Path::kDot, attn::Bf16Path::kWiden}) {
    if (attn::set_bf16_path(path) != path) continue;  // not on this CPU and set
    SCOPED_TRACE(attn::bf16_path_name(path));
    const auto pack = attn::detail::pack_gemm_b(n, k, b.data(), k, 0);
    for (const bool packed : {false, true}) {
      attn::Workspace ws;
      expect_steady_state_without_allocation([&] {
        attn::detail::gemm_nt(m, n, k, a.data(), k, b.data(), k, c.data(), n, bias.data(),
                              packed ? attn::detail::PackedB<attn::bfloat16>{&pack, 0}
                                     : attn::detail::PackedB<attn::bfloat16>{},
                              &ws);
      });
    }
  }
  attn::set_bf16_path(std::nullopt);
}

// A bfloat16 training step (training forward, backward into bfloat16 gradients, AdamW over
// float masters) allocates nothing once warm, on every bfloat16 path this CPU has.
TEST(ZeroAllocation, BFloat16TrainingStepWithMasterWeights) {
  attn::manual_seed(23);
  // Smaller than the float steps' shape (three paths, each its own warm-up): still several
  // query tiles and key blocks, and depth blocks of whole AMX tiles.
  const Index batch = 2, tokens = 64, dim = 64;
  auto mha = attn::convert<attn::bfloat16>(
      MultiHeadAttention<float>(dim, dim, tokens, /*dropout=*/0.1, kHeads, true));
  const auto x = attn::convert<attn::bfloat16>(
      attn::test::random_tensor<float>(Shape<3>{batch, tokens, dim}, 24));
  const auto grad_out = attn::convert<attn::bfloat16>(
      attn::test::random_tensor<float>(Shape<3>{batch, tokens, dim}, 25));
  AttentionMask<float> mask;
  mask.key_lengths({tokens, tokens - 3});
  Tensor<attn::bfloat16, 3> out({batch, tokens, dim}), gx({batch, tokens, dim});
  attn::SavedForward<attn::bfloat16> saved;
  attn::Gradients<attn::bfloat16> grads(mha.named_parameters());
  attn::optim::MixedPrecision<attn::optim::AdamW<float>> adamw(mha.named_parameters());
  for (const attn::Bf16Path path :
       {attn::Bf16Path::kAmx, attn::Bf16Path::kDot, attn::Bf16Path::kWiden}) {
    if (attn::set_bf16_path(path) != path) continue;  // not on this CPU and set
    SCOPED_TRACE(attn::bf16_path_name(path));
    attn::Workspace ws;
    expect_steady_state_without_allocation([&] {
      mha.forward(x.view(), out.view(), saved, ws, mask);
      grads.zero();
      gx.fill(attn::bfloat16(0.0f));
      mha.backward(grad_out.view(), saved, gx.view(), grads, ws);
      adamw.step(grads);
    });
  }
  attn::set_bf16_path(std::nullopt);
}

// A float16 training step with a loss scale (training forward, backward of the scaled dL/dy
// into float16 gradients, AdamW over float masters) allocates nothing once warm, on every
// bfloat16 path this CPU has (a float16 module ignores it: widened products on every path).
TEST(ZeroAllocation, Float16TrainingStepWithLossScaling) {
  attn::manual_seed(28);
  const Index batch = 2, tokens = 64, dim = 64;
  auto mha = attn::convert<attn::float16>(
      MultiHeadAttention<float>(dim, dim, tokens, /*dropout=*/0.1, kHeads, true));
  const auto x = attn::convert<attn::float16>(
      attn::test::random_tensor<float>(Shape<3>{batch, tokens, dim}, 29));
  const auto grad_out = attn::test::random_tensor<float>(Shape<3>{batch, tokens, dim}, 30);
  AttentionMask<float> mask;
  mask.key_lengths({tokens, tokens - 3});
  Tensor<attn::float16, 3> out({batch, tokens, dim}), gx({batch, tokens, dim}),
      scaled({batch, tokens, dim});
  attn::SavedForward<attn::float16> saved;
  attn::Gradients<attn::float16> grads(mha.named_parameters());
  attn::optim::MixedPrecision<attn::optim::AdamW<float>, attn::float16> adamw(
      mha.named_parameters());
  attn::optim::LossScaling scaling;
  scaling.init_scale = 1024.0f;  // dL/dy of O(1) scaled stays finite in float16
  adamw.set_loss_scaling(scaling);
  for (const attn::Bf16Path path : {attn::Bf16Path::kDot, attn::Bf16Path::kWiden}) {
    if (attn::set_bf16_path(path) != path) continue;  // not on this CPU and set
    SCOPED_TRACE(attn::bf16_path_name(path));
    attn::Workspace ws;
    expect_steady_state_without_allocation([&] {
      mha.forward(x.view(), out.view(), saved, ws, mask);
      const float s = adamw.loss_scale();
      for (Index i = 0; i < scaled.size(); ++i) {
        scaled.data()[i] = attn::float16(grad_out.data()[i] * s);
      }
      grads.zero();
      gx.fill(attn::float16(0.0f));
      mha.backward(scaled.view(), saved, gx.view(), grads, ws);
      EXPECT_TRUE(adamw.step(grads));
    });
  }
  attn::set_bf16_path(std::nullopt);
}

// A float16 module's MixedPrecision step with dynamic loss scaling allocates nothing, whether
// it steps (the scale growing every second step) or skips one for an Inf in a gradient.
TEST(ZeroAllocation, Float16MixedPrecisionStepWithLossScaling) {
  attn::manual_seed(26);
  auto mha = attn::convert<attn::float16>(
      MultiHeadAttention<float>(kDim, kDim, kTokens, /*dropout=*/0.0, kHeads, true));
  attn::Gradients<attn::float16> grads(mha.named_parameters());
  attn::optim::MixedPrecision<attn::optim::AdamW<float>, attn::float16> adamw(
      mha.named_parameters());
  attn::optim::LossScaling scaling;
  scaling.growth_interval = 2;
  adamw.set_loss_scaling(scaling);
  const auto g = grads[0].matrix();
  int calls = 0;
  expect_steady_state_without_allocation([&] {
    g(0, 0) = attn::float16(++calls % 3 == 0 ? std::numeric_limits<float>::infinity() : 0.5f);
    adamw.step(grads);
  });
  EXPECT_EQ(adamw.skipped_steps(), 2);
  EXPECT_EQ(adamw.optimizer().steps(), 4);
}

// A packed training step (the packed training forward and its backward: one kernel call per
// sequence, their tables and the offsets' checks) allocates nothing once warm: a float module,
// and its bfloat16 twin on this CPU's bfloat16 path (self-attention, causal, sequences of 0 to
// 40 tokens: several query tiles in the longest).
TEST(ZeroAllocation, PackedTrainingStep) {
  attn::manual_seed(27);
  const Index dim = 64;
  const attn::PackedSequences seqs(attn::SequenceOffsets::from_lengths({17, 0, 40, 3}));
  const Index total = seqs.query.view()(seqs.query.sequences());
  MultiHeadAttentionOptions o;
  o.d_in = dim;
  o.num_heads = kHeads;
  o.causal = true;
  const MultiHeadAttention<float> mha(o);
  const auto mha_bf16 = attn::convert<attn::bfloat16>(mha);
  const auto run = [&](const auto& m, auto zero) {
    using E = decltype(zero);
    const auto x = attn::convert<E>(attn::test::random_tensor<float>(Shape<2>{total, dim}, 28));
    const auto grad_out =
        attn::convert<E>(attn::test::random_tensor<float>(Shape<2>{total, dim}, 29));
    Tensor<E, 2> out({total, dim}), gx({total, dim});
    attn::SavedForward<E> saved;
    attn::Gradients<E> grads(m.named_parameters());
    attn::Workspace ws;
    expect_steady_state_without_allocation([&] {
      m.forward(x.view(), x.view(), x.view(), seqs, out.view(), saved, ws);
      gx.fill(zero);
      m.backward(grad_out.view(), saved, gx.view(), gx.view(), gx.view(), grads, ws);
    });
  };
  {
    SCOPED_TRACE("float");
    run(mha, 0.0f);
  }
  SCOPED_TRACE("bfloat16");
  run(mha_bf16, attn::bfloat16(0.0f));
}

}  // namespace

#include "support/bodies_end.hpp"
