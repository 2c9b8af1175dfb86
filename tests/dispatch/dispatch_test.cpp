// SPDX-License-Identifier: MIT
// tests/dispatch/dispatch_test.cpp: runtime CPU dispatch (attn/isa.hpp, attn/kernels/).
//  - Two translation units of this program include attn, one built for baseline x86-64 and
//    one with -march=native (dispatch_tu_*.cpp). Each must run the widest kernels the CPU
//    has, and for every kernel set both must compute the same bits: the kernels do not
//    depend on the including unit's flags, and the ABI tag keeps the units' inline functions
//    apart (a linker that merged them would hand one unit the other's machine code).
//  - set_isa() clamps to the CPU, active_isa() reports it; ATTN_ISA is read on first use
//    (ctest runs this binary's --report mode with ATTN_ISA set: see tests/CMakeLists.txt).
//  - A weight packed for one set is not read by another (its layout differs), with correct
//    results either way.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "attn/attn.hpp"
#include "dispatch_workload.hpp"
#include "support/test_support.hpp"

namespace {

using attn::Isa;

using attn::test::runnable_sets;

TEST(Dispatch, BothUnitsRunTheWidestSetByDefaultAndHaveDifferentAbiTags) {
  const DispatchDigest baseline = run_baseline_unit(attn::best_isa(), 1);
  const DispatchDigest native = run_native_unit(attn::best_isa(), 1);
  EXPECT_EQ(baseline.ran_on, attn::isa_name(attn::best_isa()));
  EXPECT_EQ(native.ran_on, attn::isa_name(attn::best_isa()));
  EXPECT_EQ(baseline.compiled_for, "baseline flags");
#if ATTN_KERNELS_X86
  if (attn::best_isa() >= Isa::kAvx2) {
    EXPECT_NE(native.compiled_for, "baseline flags");
  }
  // Different flags, different inline namespaces: no symbol of one unit can stand in for
  // the other's.
  EXPECT_NE(baseline.abi_tag, native.abi_tag);
#endif
  std::printf("baseline unit: %s, %s\nnative unit:   %s, %s\n", baseline.abi_tag.c_str(),
              baseline.compiled_for.c_str(), native.abi_tag.c_str(), native.compiled_for.c_str());
}

TEST(Dispatch, EverySetComputesTheSameBitsWhateverTheFlagsAndThreads) {
  for (const Isa isa : runnable_sets()) {
    const DispatchDigest reference = run_baseline_unit(isa, 1);
    EXPECT_EQ(reference.ran_on, attn::isa_name(isa));
    for (const int threads : {1, 2}) {
      const DispatchDigest baseline = run_baseline_unit(isa, threads);
      const DispatchDigest native = run_native_unit(isa, threads);
      EXPECT_EQ(native.ran_on, attn::isa_name(isa));
      EXPECT_EQ(baseline.hash, reference.hash) << attn::isa_name(isa) << " threads=" << threads;
      EXPECT_EQ(native.hash, reference.hash)
          << attn::isa_name(isa) << " threads=" << threads
          << ": the -march=native unit computed different bits from the baseline unit";
    }
  }
  attn::set_isa(attn::best_isa());
}

TEST(Dispatch, SetsRoundDifferentlySoTheDigestCanTellThemApart) {
  // Guards the test above: if every set produced the same digest it would prove nothing about
  // which set ran. FMA (AVX2, AVX-512) and no FMA (scalar, SSE2) round differently.
#if ATTN_KERNELS_X86
  if (attn::best_isa() < Isa::kAvx2) GTEST_SKIP() << "needs an FMA set";
  EXPECT_NE(run_baseline_unit(Isa::kSse2, 1).hash, run_baseline_unit(Isa::kAvx2, 1).hash);
  attn::set_isa(attn::best_isa());
#else
  GTEST_SKIP() << "one set only on this target";
#endif
}

TEST(Dispatch, SetIsaClampsToTheCpuAndActiveIsaReportsIt) {
  for (const Isa isa : {Isa::kScalar, Isa::kSse2, Isa::kAvx2, Isa::kAvx512}) {
    const Isa got = attn::set_isa(isa);
    EXPECT_EQ(got, isa <= attn::best_isa() ? isa : attn::best_isa()) << attn::isa_name(isa);
    EXPECT_EQ(attn::active_isa(), got);
  }
  attn::set_isa(attn::best_isa());
}

TEST(Dispatch, IsaNamesRoundTrip) {
  for (const Isa isa : {Isa::kScalar, Isa::kSse2, Isa::kAvx2, Isa::kAvx512}) {
    Isa parsed = Isa::kScalar;
    ASSERT_TRUE(attn::parse_isa(attn::isa_name(isa), parsed));
    EXPECT_EQ(parsed, isa);
  }
  Isa unused = Isa::kScalar;
  EXPECT_FALSE(attn::parse_isa("avx", unused));
  EXPECT_FALSE(attn::parse_isa("AVX2", unused));
  EXPECT_FALSE(attn::parse_isa(nullptr, unused));
}

TEST(Dispatch, AWeightPackedForOneSetIsNotReadByAnother) {
  // The pack's micro-panels are as wide as the packing set's micro-kernel (64 floats with
  // AVX-512, 16 with AVX2, 8 with SSE2): a frozen module used after set_isa() must repack
  // per call rather than read a foreign layout.
  attn::TorchGenerator gen(7);
  attn::MultiHeadAttention<float> mha(attn::MultiHeadAttentionOptions::pytorch(64, 4), gen);
  mha.eval();
  attn::Tensor<float, 3> x({2, 33, 64});
  gen.fill_uniform(x.view(), -1.0, 1.0);
  for (const Isa packed_for : runnable_sets()) {
    for (const Isa runs_on : runnable_sets()) {
      attn::set_isa(packed_for);
      mha.freeze();
      attn::set_isa(runs_on);
      const auto frozen = mha.forward(x);
      mha.unfreeze();
      const auto unfrozen = mha.forward(x);
      EXPECT_EQ(frozen.to_vector(), unfrozen.to_vector())
          << "packed for " << attn::isa_name(packed_for) << ", run on " << attn::isa_name(runs_on);
    }
  }
  attn::set_isa(attn::best_isa());
}

}  // namespace

// --report: print the set ATTN_ISA selected (or the error it caused) and exit; ctest checks
// the output with ATTN_ISA set in the environment.
int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--report") == 0) {
    try {
      const Isa isa = attn::active_isa();
      const DispatchDigest d = run_baseline_unit(isa, 1);
      std::printf("active=%s ran_on=%s best=%s active_is_best=%d\n", attn::isa_name(isa),
                  d.ran_on.c_str(), attn::isa_name(attn::best_isa()),
                  isa == attn::best_isa() && d.ran_on == attn::isa_name(isa) ? 1 : 0);
      return 0;
    } catch (const attn::Error& e) {
      std::printf("error: %s\n", e.what());
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
