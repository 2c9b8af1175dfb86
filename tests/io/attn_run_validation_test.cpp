// SPDX-License-Identifier: MIT
// tests/io/attn_run_validation_test.cpp: attn_run checks every input against its flags
// before it allocates anything sized by them, and says what is wrong in the words of the
// mode it runs:
//  - --format llama sized its RoPE tables from the input header's T before checking the
//    input: a file declaring a (1, 2^34, 0) query (no data at all) died with a bare
//    std::bad_alloc; an MHA-mode float key padding mask was expanded to (B, T_q, T_k) before
//    the query's width was checked, likewise;
//  - --sliding-window N sized the ring by N even for a 6-token input (2^30 asked for tens
//    of GiB), and --chunk C the ring by C;
//  - --rope-theta 1e-50 (0 as a float) ran and wrote NaN everywhere, exiting 0;
//  - --backward with --format llama was silently ignored;
//  - an empty query said "KVCache sizes must be positive", a missing k_proj.weight was
//    reported as a v_proj shape error, and llama-mode dtype errors were prefixed
//    run_multi_head_attention.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/file_test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace attn_run_validation_test {

namespace {

using attn::Index;
using attn::io::DType;
using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr Index kHuge = Index(1) << 34;

// A Llama layer: 4 query heads and 2 key/value heads of 4 over D = 16.
SafetensorsWriter llama_writer(const std::string& skip = "") {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 16;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  attn::TorchGenerator gen(5);
  const attn::MultiHeadAttention<float> m(o, gen);
  SafetensorsWriter all, w;
  attn::io::save_state_dict(m, all, "", attn::ParameterNames::kLlama);
  const SafetensorsFile file = SafetensorsFile::from_bytes(all.to_bytes());
  for (const std::string& name : file.names()) {
    if (name == skip) continue;
    const attn::io::TensorInfo& info = file.info(name);
    const unsigned char* data = file.raw_data(name);
    w.add_raw(name, info.dtype, info.shape,
              std::vector<unsigned char>(data, data + info.end - info.begin));
  }
  return w;
}
SafetensorsFile llama_weights(const std::string& skip = "") {
  return SafetensorsFile::from_bytes(llama_writer(skip).to_bytes(), "w.safetensors");
}

SafetensorsFile tokens(Index batch, Index t, Index d = 16) {
  SafetensorsWriter w;
  attn::Tensor<float, 3> x({batch, t, d});
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.37f * static_cast<float>(i));
  w.add("query", x);
  return SafetensorsFile::from_bytes(w.to_bytes(), "x.safetensors");
}

/// An input file whose `query` has `shape` (F32) and no data when an extent is 0.
SafetensorsFile declared(const std::vector<Index>& shape, DType dtype = DType::kF32) {
  SafetensorsWriter w;
  Index count = 1;
  for (const Index e : shape) count *= e;
  w.add_raw("query", dtype, shape,
            std::vector<unsigned char>(static_cast<std::size_t>(count) * dtype_size(dtype)));
  return SafetensorsFile::from_bytes(w.to_bytes(), "x.safetensors");
}

attn_run::LlamaOptions llama_options() {
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  return o;
}

std::vector<float> output(const SafetensorsFile& input, const attn_run::LlamaOptions& o) {
  const auto out = attn_run::run_llama<float>(llama_weights(), input, o);
  return SafetensorsFile::from_bytes(out.to_bytes()).values<float>("output");
}

// Largest |a - b|; infinite if the sizes differ.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return d;
}

TEST(AttnRunValidation, AHugeDeclaredQueryIsRefusedBeforeAnyTableIsSized) {
  for (const std::vector<Index>& shape :
       {std::vector<Index>{1, kHuge, 0}, std::vector<Index>{kHuge, 0}, std::vector<Index>{0, 5, 16},
        std::vector<Index>{3, 0, 16}}) {
    SCOPED_TRACE(attn::io::detail::shape_text(shape));
    EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                  attn_run::run_llama<float>(llama_weights(), declared(shape), llama_options());
                }),
                AllOf(HasSubstr("run_llama"), HasSubstr("query has shape")));
  }
}

TEST(AttnRunValidation, AnEmptyQuerySaysSo) {
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn_run::run_llama<float>(llama_weights(), tokens(2, 0), llama_options());
              }),
              AllOf(HasSubstr("query has shape (2, 0, 16)"), Not(HasSubstr("KVCache"))));
}

TEST(AttnRunValidation, TheRingIsSizedByTheTokensThereAre) {
  const SafetensorsFile x = tokens(2, 6);
  attn_run::LlamaOptions o = llama_options();
  const std::vector<float> plain = output(x, o);
  // A window wider than the input changes nothing, however wide; nor does a chunk longer
  // than the input. (Other splits of the sequence agree to float rounding: the outputs are
  // O(1), 1e-5 is the parity tolerance, a wrong mask is off by 1e-2.)
  o.sliding_window = Index(1) << 30;
  EXPECT_LE(max_diff(output(x, o), plain), 1e-5);
  o.prefill = 2;
  o.chunk = Index(1) << 30;
  EXPECT_LE(max_diff(output(x, o), plain), 1e-5);
  o.sliding_window = 3;  // narrower than the input: a ring of 3 + 4 - 1 rows
  EXPECT_NO_THROW(output(x, o));
}

TEST(AttnRunValidation, AThetaThatIsZeroAsAFloatIsRefused) {
  attn_run::LlamaOptions o = llama_options();
  o.rope_theta = 1e-50;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>([&] { output(tokens(1, 4), o); }),
              HasSubstr("theta=1e-50"));
  EXPECT_NO_THROW(attn_run::run_llama<double>(llama_weights(), tokens(1, 4), o));
  // Through the program: exit status 1, no output written.
  const attn::test::TempDir dir;
  llama_writer().save(dir.file("w.safetensors"));
  SafetensorsWriter x;
  x.add("query", attn::Tensor<float, 3>({1, 4, 16}));
  x.save(dir.file("x.safetensors"));
  std::ostringstream out, err;
  EXPECT_EQ(attn_run::main({"--format", "llama", "--weights", dir.file("w.safetensors"), "--input",
                            dir.file("x.safetensors"), "--output", dir.file("y.safetensors"),
                            "--num-heads", "4", "--rope-theta", "1e-50"},
                           out, err),
            1);
  EXPECT_THAT(err.str(), HasSubstr("theta=1e-50"));
  EXPECT_THAT(dir.others("w.safetensors"), ::testing::ElementsAre("x.safetensors"));
}

TEST(AttnRunValidation, BackwardWithTheLlamaFormatIsAnError) {
  const attn_run::ParsedArguments p =
      attn_run::parse_arguments({"--format", "llama", "--weights", "w", "--input", "x", "--output",
                                 "y", "--num-heads", "4", "--backward"});
  EXPECT_EQ(p.action, attn_run::ParsedArguments::Action::kError);
  EXPECT_THAT(p.error, HasSubstr("--backward is not used with --format llama"));
}

TEST(AttnRunValidation, AMissingProjectionIsNamed) {
  for (const std::string name : {"k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
    EXPECT_THAT(attn::test::thrown<attn::io::StateDictError>([&] {
                  attn_run::run_llama<float>(llama_weights(name), tokens(1, 4), llama_options());
                }),
                AllOf(HasSubstr("has no tensor '" + name + "'"), Not(HasSubstr("shape"))));
  }
}

TEST(AttnRunValidation, LlamaErrorsNameTheLlamaRunner) {
  EXPECT_THAT(
      attn::test::thrown<attn::io::FormatError>([&] {
        attn_run::run_llama<float>(llama_weights(), declared({1, 4, 16}, DType::kI32),
                                   llama_options());
      }),
      AllOf(HasSubstr("run_llama"), HasSubstr("I32"), Not(HasSubstr("run_multi_head_attention"))));
}

// MHA mode: the query's width is checked against the weights before a float key padding
// mask is expanded to (B, T_q, T_k) (2^34 x 2 floats here).
TEST(AttnRunValidation, MhaInputsAreCheckedBeforeTheMasksAreBuilt) {
  attn::TorchGenerator gen(3);
  const attn::MultiHeadAttention<float> m(attn::MultiHeadAttentionOptions::pytorch(8, 2), gen);
  SafetensorsWriter ww;
  attn::io::save_state_dict(m, ww);
  const SafetensorsFile weights = SafetensorsFile::from_bytes(ww.to_bytes(), "w");
  SafetensorsWriter w;
  w.add_raw("query", DType::kF32, {1, kHuge, 0}, {});
  w.add("key", attn::Tensor<float, 3>({1, 2, 8}));
  w.add("value", attn::Tensor<float, 3>({1, 2, 8}));
  w.add("key_padding_mask", attn::Tensor<float, 2>({1, 2}));
  const SafetensorsFile x = SafetensorsFile::from_bytes(w.to_bytes(), "x");
  attn_run::RunOptions o;
  o.num_heads = 2;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { attn_run::run_multi_head_attention<float>(weights, x, o); }),
              HasSubstr("query has shape (1, 17179869184, 0)"));
}

}  // namespace

}  // namespace attn_run_validation_test

#include "support/bodies_end.hpp"
