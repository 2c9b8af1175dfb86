// SPDX-License-Identifier: MIT
// fuzz/kv_cache_fuzz.cpp: libFuzzer target for the generation API: a KVCache driven through a
// random sequence of calls (the incremental forward of a small MultiHeadAttention in double,
// append, next_rows + advance, advance alone, truncate, reorder, reset, the accessors, another
// module on the same cache), with random shapes and options (batch, grouped-query heads,
// head dim, bias, rotary embeddings in both conventions, a sliding window and so a ring that
// wraps, chunk sizes, capacities) and hostile arguments (items, heads, positions and counts
// out of range).
//
// Checked wherever a call succeeds:
//  - the incremental forward's rows equal the whole-sequence forward of each item's tokens
//    so far (the fuzzer keeps its own copy of every item's sequence), to 1e-9: both are the
//    same double arithmetic in another order (per-chunk tiles, split keys), so they differ by
//    a few eps times the reduction lengths (d + T <= 64 here: below 1e-13 for these O(1)
//    values), while a wrong key, position or mask bound moves an output by 1e-3 or more;
//  - the cache's lengths and first positions follow the calls (the fuzzer's own model);
//  - rows written with append() or next_rows() are where k_slot()/v_slot() say.
// Where a call throws, it must be an attn::Error and leave the lengths unchanged. Anything
// else (another exception, a sanitizer report, a mismatch) aborts.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "attn/attn.hpp"
#include "targets.hpp"

namespace kv_cache_fuzz {
namespace {

using attn::Index;
using attn::KVCache;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

[[noreturn]] void fail() { std::abort(); }
void expect(bool ok) {
  if (!ok) fail();
}

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (u8() & 1) != 0; }
  /// 0..n-1 mostly; now and then a hostile value: negative, n, or far past it.
  Index index(Index n) {
    const std::uint8_t b = u8();
    if (b == 255) return -1 - Index(u8());
    if (b == 254) return n;
    if (b == 253) return n + Index(u8()) * 1000003;
    if (b == 252) return std::numeric_limits<Index>::max() - Index(u8());
    return n > 0 ? Index(b) % n : Index(b);
  }
  double value() { return (static_cast<int>(u8()) - 128) / 64.0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

struct Setup {
  Index batch, heads, kv_heads, head_dim, d, window, max_chunk, capacity;
  bool rope, interleaved, bias;
};

constexpr Index kMaxTokens = 40;  // per item: keeps the whole-sequence forwards cheap

attn::MultiHeadAttention<double> make_module(const Setup& s, std::uint64_t seed) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = s.d;
  o.num_heads = s.heads;
  o.num_kv_heads = s.kv_heads;
  o.head_dim = s.head_dim;
  o.qkv_bias = s.bias;
  o.out_bias = s.bias;
  o.causal = true;
  o.sliding_window = s.window;
  if (s.rope) {
    o.rope = attn::RotaryOptions{
        s.head_dim, 0, 10000.0,
        s.interleaved ? attn::RopeStyle::kInterleaved : attn::RopeStyle::kHalfSplit,
        kMaxTokens + 8};
  }
  attn::TorchGenerator gen(seed);
  attn::MultiHeadAttention<double> m(o, gen);
  m.eval();
  return m;
}

/// The fuzzer's model of the cache: per item, the tokens the module saw (rows of d), and
/// whether rows of unknown meaning (written by hand) were counted in since the last reset.
struct Model {
  std::vector<std::vector<double>> tokens;
  std::vector<bool> tainted;
  std::vector<Index> first;  // the cache's first positions, as last seen
};

void expect_lengths(const KVCache<double>& cache, const std::vector<Index>& lengths) {
  for (Index b = 0; b < cache.batch(); ++b) expect(cache.length(b) == lengths[std::size_t(b)]);
}
std::vector<Index> lengths_of(const KVCache<double>& cache) {
  std::vector<Index> out;
  for (Index b = 0; b < cache.batch(); ++b) out.push_back(cache.length(b));
  return out;
}

/// Runs `call`; an attn::Error leaves the lengths as they were. Returns whether it succeeded.
template <class Call>
bool attempt(const KVCache<double>& cache, Call&& call) {
  const std::vector<Index> before = lengths_of(cache);
  try {
    call();
    return true;
  } catch (const attn::Error&) {
    expect_lengths(cache, before);
    return false;
  }
}

void step(Bytes& in, const Setup& s, const attn::MultiHeadAttention<double>& m,
          const attn::MultiHeadAttention<double>& other, KVCache<double>& cache, Model& model,
          attn::Workspace& ws) {
  const Index batch = s.batch, d = s.d;
  switch (in.u8() % 12) {
    case 0:
    case 1:
    case 2:
    case 3: {  // the incremental forward of T new tokens per item, checked against the whole
      const Index t = 1 + Index(in.u8() % 6);
      Tensor<double, 3> x({batch, t, d}), out({batch, t, d});
      for (Index i = 0; i < x.size(); ++i) x.data()[i] = in.value();
      const bool in_place = in.u8() % 4 == 0;
      if (in_place) out = x;
      const bool ok = attempt(cache, [&] {
        m.forward(TensorView<const double, 3>(in_place ? out.view() : x.view()), out.view(), ws,
                  cache);
      });
      if (!ok) return;
      for (Index b = 0; b < batch; ++b) {
        auto& rows = model.tokens[std::size_t(b)];
        for (Index i = 0; i < t * d; ++i) rows.push_back(x.data()[b * t * d + i]);
        const Index len = static_cast<Index>(rows.size()) / d;
        expect(cache.length(b) == len);
        if (model.tainted[std::size_t(b)]) continue;
        const Tensor<double, 3> whole =
            m.forward(TensorView<const double, 3>(rows.data(), {1, len, d}));
        for (Index i = 0; i < t; ++i) {
          for (Index e = 0; e < d; ++e) {
            const double got = out(b, i, e), want = whole(0, len - t + i, e);
            expect(std::isfinite(got) && std::abs(got - want) <= 1e-9);
          }
        }
      }
      return;
    }
    case 4: {  // truncate an item (rolls back rejected tokens)
      const Index b = in.index(batch);
      const Index n = in.index(kMaxTokens);
      if (attempt(cache, [&] { cache.truncate(b, n); })) {
        model.tokens[std::size_t(b)].resize(std::size_t(n * d));
        expect(cache.length(b) == n);
      }
      return;
    }
    case 5: {  // reorder the items (beam search), repeats allowed, now and then bad entries
      std::vector<Index> src;
      const Index n = in.u8() % 16 == 0 ? batch + 1 : batch;
      for (Index b = 0; b < n; ++b) src.push_back(in.index(batch));
      if (attempt(cache, [&] { cache.reorder(src); })) {
        const Model old = model;
        for (Index b = 0; b < batch; ++b) {
          const auto from = std::size_t(src[std::size_t(b)]);
          model.tokens[std::size_t(b)] = old.tokens[from];
          model.tainted[std::size_t(b)] = old.tainted[from];
        }
      }
      return;
    }
    case 6: {  // advance alone (rows not written: those items hold unknown keys from now on)
      const Index t = in.index(4), first = in.index(batch), items = in.index(batch + 1) - 1;
      const std::vector<Index> before = lengths_of(cache);
      if (attempt(cache, [&] { cache.advance(t, first, items); })) {
        const Index last = items < 0 ? batch : first + items;
        for (Index b = 0; b < batch; ++b) {
          const bool moved = b >= first && b < last;
          expect(cache.length(b) == before[std::size_t(b)] + (moved ? t : 0));
          if (moved && t > 0) {
            model.tainted[std::size_t(b)] = true;
            model.tokens[std::size_t(b)].resize(std::size_t(cache.length(b) * d), 0.0);
          }
        }
      }
      return;
    }
    case 7: {  // append rows by hand; they must land where k_slot()/v_slot() say
      const Index first = in.index(batch), items = 1 + Index(in.u8() % 2), t = in.index(4);
      const Index kv = s.kv_heads, hd = s.head_dim;
      const Index ok_items = std::max<Index>(0, std::min(items, batch));
      const Index ok_t = std::max<Index>(0, std::min<Index>(t, 8));
      Tensor<double, 4> k({ok_items, kv, ok_t, hd}), v({ok_items, kv, ok_t, hd});
      for (Index i = 0; i < k.size(); ++i) k.data()[i] = in.value(), v.data()[i] = in.value();
      const std::vector<Index> before = lengths_of(cache);
      if (attempt(cache, [&] { cache.append(k.view(), v.view(), first); })) {
        for (Index i = 0; i < ok_items; ++i) {
          const Index b = first + i;
          for (Index h = 0; h < kv; ++h) {
            for (Index r = 0; r < ok_t; ++r) {
              const Index pos = before[std::size_t(b)] + r;
              for (Index e = 0; e < hd; ++e) {
                expect(cache.k_slot(b, h, pos)[e] == k(i, h, r, e));
                expect(cache.v_slot(b, h, pos)[e] == v(i, h, r, e));
              }
            }
          }
          if (ok_t > 0) {
            model.tainted[std::size_t(b)] = true;
            model.tokens[std::size_t(b)].resize(std::size_t(cache.length(b) * d), 0.0);
          }
        }
      }
      return;
    }
    case 8: {  // next_rows + advance: the rows given are the slots of those positions
      const Index t = in.index(3);
      try {
        const TensorView<double, 4> rows = cache.next_rows(t);
        const std::vector<Index> before = lengths_of(cache);
        for (Index b = 0; b < rows.extent(0); ++b) {
          for (Index h = 0; h < rows.extent(1); ++h) {
            for (Index r = 0; r < rows.extent(2); ++r) {
              const Index pos = before[std::size_t(b)] + r;
              const double* want =
                  h < s.kv_heads ? cache.k_slot(b, h, pos) : cache.v_slot(b, h - s.kv_heads, pos);
              expect(&rows(b, h, r, 0) == want);
              for (Index e = 0; e < s.head_dim; ++e) rows(b, h, r, e) = in.value();
            }
          }
        }
        cache.advance(t);
        if (t > 0) {
          for (Index b = 0; b < batch; ++b) {
            model.tainted[std::size_t(b)] = true;
            model.tokens[std::size_t(b)].resize(std::size_t(cache.length(b) * d), 0.0);
          }
        }
      } catch (const attn::Error&) {
      }
      return;
    }
    case 9: {  // the accessors with any index: a valid answer or an attn::Error
      const Index b = in.index(batch), h = in.index(s.kv_heads), p = in.index(cache.capacity());
      try {
        const Index len = cache.length(b), first = cache.first_position(b);
        expect(len >= first && first >= 0 && cache.stored(b) == len - first);
        const attn::KVSegments seg = cache.segments(b);
        expect(seg.count[0] + seg.count[1] == len - first && seg.count[1] >= 0);
        const TensorView<const double, 3> keys = cache.k(b);
        expect(keys.extent(1) == std::min(len, cache.capacity()));
      } catch (const attn::Error&) {
      }
      try {
        const double* row = cache.k_slot(b, h, p);
        const double* begin = cache.k_storage().data();
        expect(row >= begin &&
               row + s.head_dim <= begin + cache.bytes() / sizeof(double));  // inside
      } catch (const attn::Error&) {
      }
      return;
    }
    case 10: {  // another module on a cache that holds this one's keys: refused unless empty
      const Tensor<double, 3> x({batch, 1, d});
      Tensor<double, 3> out({batch, 1, d});
      const bool claimed = !cache.empty() && cache.owner() != 0;  // by m: rows written by
                                                                  // hand claim nothing
      const bool ok = attempt(cache, [&] { other.forward(x.view(), out.view(), ws, cache); });
      if (claimed) expect(!ok);
      if (ok) {  // it owns the cache now: start over with it out of the way
        cache.reset();
        for (auto& rows : model.tokens) rows.clear();
        std::fill(model.tainted.begin(), model.tainted.end(), false);
      }
      return;
    }
    default: {  // reset
      cache.reset();
      expect(cache.empty());
      for (auto& rows : model.tokens) rows.clear();
      std::fill(model.tainted.begin(), model.tainted.end(), false);
      return;
    }
  }
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  Setup s{};
  s.batch = 1 + in.u8() % 3;
  s.kv_heads = 1 + in.u8() % 2;
  s.heads = s.kv_heads * (1 + in.u8() % 2);
  s.head_dim = 2 * (1 + in.u8() % 2);
  s.d = 2 + in.u8() % 7;
  s.bias = in.flag();
  s.rope = in.flag();
  s.interleaved = in.flag();
  s.window = in.u8() % 3 == 0 ? 1 + Index(in.u8() % 6) : 0;
  s.max_chunk = 1 + in.u8() % 4;
  s.capacity = 2 + in.u8() % kMaxTokens;
  const std::uint64_t seed = in.u8();
  try {
    const attn::MultiHeadAttention<double> m = make_module(s, seed);
    const attn::MultiHeadAttention<double> other = make_module(s, seed + 1);
    KVCache<double> cache = s.window > 0
                                ? KVCache<double>::sliding_window(s.batch, s.kv_heads, s.head_dim,
                                                                  s.window, s.max_chunk)
                                : KVCache<double>(s.batch, s.kv_heads, s.head_dim, s.capacity);
    Model model;
    model.tokens.assign(std::size_t(s.batch), {});
    model.tainted.assign(std::size_t(s.batch), false);
    attn::Workspace ws;
    for (int calls = 0; calls < 64 && !in.done(); ++calls) step(in, s, m, other, cache, model, ws);
  } catch (const attn::Error&) {  // a configuration the library refuses
  }
  return 0;
}

}  // namespace kv_cache_fuzz
