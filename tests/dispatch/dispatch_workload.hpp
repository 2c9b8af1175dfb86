// SPDX-License-Identifier: MIT
// tests/dispatch/dispatch_workload.hpp: one workload, compiled into two translation units of
// the same program with different instruction-set flags (see tests/CMakeLists.txt:
// -march=x86-64 and -march=native). Each defines its entry point (run_baseline_unit or
// run_native_unit, named by ATTN_DISPATCH_TU), which forces a kernel set, runs the workload
// and returns a digest of every output bit and what it ran on.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "attn/attn.hpp"

#define ATTN_TEST_STR_(x) #x
#define ATTN_TEST_STR(x) ATTN_TEST_STR_(x)

struct DispatchDigest {
  std::uint64_t hash = 0;    // FNV-1a over the bytes of every output
  std::string ran_on;        // attn::active_isa() while the workload ran
  std::string abi_tag;       // this translation unit's inline namespace
  std::string compiled_for;  // whether the unit was compiled with AVX2 / AVX-512 flags
};

DispatchDigest run_baseline_unit(attn::Isa isa, int threads);
DispatchDigest run_native_unit(attn::Isa isa, int threads);

#ifdef ATTN_DISPATCH_TU
namespace {

struct Fnv {
  std::uint64_t h = 1469598103934665603ULL;
  template <class Scalar, std::size_t Rank>
  void add(const attn::Tensor<Scalar, Rank>& t) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(t.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(t.size()) * sizeof(Scalar); ++i) {
      h = (h ^ bytes[i]) * 1099511628211ULL;
    }
  }
};

template <class Scalar>
void workload(Fnv& fnv) {
  // Ragged on purpose: T = 77 is not a multiple of any tile, head_dim 12 is not a multiple of
  // any micro-panel width, D = 48 leaves a partial register on every set.
  attn::TorchGenerator gen(2024);
  attn::MultiHeadAttention<Scalar> mha(attn::MultiHeadAttentionOptions::pytorch(48, 4), gen);
  mha.eval();
  attn::Tensor<Scalar, 3> x({2, 77, 48}), kv({2, 50, 48});
  gen.fill_uniform(x.view(), -2.0, 2.0);
  gen.fill_uniform(kv.view(), -2.0, 2.0);
  attn::AttentionMask<Scalar> mask;
  mask.causal(attn::CausalAlignment::kTopLeft).key_lengths({77, 60});
  for (const bool frozen : {false, true}) {
    if (frozen) mha.freeze();
    fnv.add(mha.forward(x));                             // streaming, one fused GEMM
    fnv.add(mha.forward(x, x, x, mask));                 // streaming with loop bounds
    const auto r = mha.forward_with_weights(x, kv, kv);  // materialised, cross
    fnv.add(r.output);
    fnv.add(r.weights);
  }
  // softmax over an odd length, and a Linear with a ragged width.
  attn::Tensor<Scalar, 2> s({5, 37});
  gen.fill_uniform(s.view(), -30.0, 30.0);
  fnv.add(attn::softmax(s));
  attn::Linear<Scalar> lin(48, 33, true, gen);
  fnv.add(lin.forward(x));
}

}  // namespace

DispatchDigest ATTN_DISPATCH_TU(attn::Isa isa, int threads) {
  attn::set_isa(isa);
  attn::set_num_threads(threads);
  Fnv fnv;
  workload<float>(fnv);
  workload<double>(fnv);
  DispatchDigest d;
  d.hash = fnv.h;
  d.ran_on = attn::isa_name(attn::active_isa());
  d.abi_tag = ATTN_TEST_STR(ATTN_ABI_TAG);
#if defined(__AVX512F__)
  d.compiled_for = "avx512 flags";
#elif defined(__AVX2__)
  d.compiled_for = "avx2 flags";
#else
  d.compiled_for = "baseline flags";
#endif
  return d;
}
#endif
