// SPDX-License-Identifier: MIT
// tests/io/attn_run_test.cpp: attn_run (tools/attn_run/): its mask dtype rules (PyTorch
// 1.13's: BOOL and U8 block, floats add, other integers are errors), its arguments, the head
// sizes it reads from a file (DeepSeek-shaped value heads under Llama's and fused names), and
// that --output naming the --input file never destroys it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/file_test_support.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace attn_run_test {

namespace {

using attn::Index;
using attn::Tensor;
using attn::io::DType;
using attn::io::FormatError;
using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using attn_run::ParsedArguments;
using attn_run::RunOptions;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr Index kB = 2, kT = 4, kE = 8, kH = 2;

SafetensorsWriter weights_writer() {
  attn::TorchGenerator gen(3);
  const attn::MultiHeadAttention<float> m(attn::MultiHeadAttentionOptions::pytorch(kE, kH), gen);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w);
  return w;
}
const SafetensorsFile& weights() {
  static const SafetensorsFile file = SafetensorsFile::from_bytes(weights_writer().to_bytes(), "w");
  return file;
}
SafetensorsWriter query_writer() {
  SafetensorsWriter w;
  w.add("query", attn::test::random_tensor<float, 3>({kB, kT, kE}, 7));
  return w;
}
std::vector<float> output_of(SafetensorsWriter inputs, bool causal = false) {
  RunOptions o;
  o.num_heads = kH;
  o.causal = causal;
  const auto in = SafetensorsFile::from_bytes(inputs.to_bytes(), "x");
  const auto out = attn_run::run_multi_head_attention<float>(weights(), in, o);
  return SafetensorsFile::from_bytes(out.to_bytes()).values<float>("output");
}
// Integer bytes of dtype `d` (little-endian) for 0/1 values, times `scale`.
std::vector<unsigned char> integer_bytes(const std::vector<int>& v, DType d, int scale = 1) {
  std::vector<unsigned char> out;
  for (const int x : v) {
    for (std::size_t i = 0; i < attn::io::dtype_size(d); ++i) {
      out.push_back(i == 0 ? static_cast<unsigned char>(x * scale) : 0);
    }
  }
  return out;
}
const std::vector<int> kTriu = {0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0};  // (T, T)
const std::vector<int> kPadding = {0, 0, 1, 1, 0, 1, 0, 0};                       // (B, T)

TEST(AttnRunMasks, U8AttnMaskBlocksLikeBool) {
  // U8 was added to the scores as 0/1 floats (relative error ~1 against PyTorch).
  SafetensorsWriter as_bool = query_writer();
  as_bool.add_raw("attn_mask", DType::kBool, {kT, kT}, integer_bytes(kTriu, DType::kBool));
  const std::vector<float> want = output_of(as_bool);
  EXPECT_EQ(want, output_of(query_writer(), /*causal=*/true));  // triu blocked = causal
  for (const int scale : {1, 7}) {  // any nonzero byte blocks, as torch's .to(torch.bool)
    SafetensorsWriter as_u8 = query_writer();
    as_u8.add_raw("attn_mask", DType::kU8, {kT, kT}, integer_bytes(kTriu, DType::kU8, scale));
    EXPECT_EQ(output_of(as_u8), want) << "scale " << scale;
  }
}

TEST(AttnRunMasks, OtherIntegerMasksAreErrors) {
  for (const DType d : {DType::kI64, DType::kI32, DType::kI8, DType::kU16}) {
    for (const char* name : {"attn_mask", "key_padding_mask"}) {
      SCOPED_TRACE(std::string(name) + " " + attn::io::dtype_name(d));
      SafetensorsWriter w = query_writer();
      if (std::string(name) == "attn_mask") {
        w.add_raw(name, d, {kT, kT}, integer_bytes(kTriu, d));
      } else {
        w.add_raw(name, d, {kB, kT}, integer_bytes(kPadding, d));
      }
      EXPECT_THAT(attn::test::thrown<FormatError>([&] { output_of(w); }),
                  HasSubstr(std::string(name) + " has dtype " + attn::io::dtype_name(d) +
                            "; expected BOOL or U8"));
    }
  }
}

TEST(AttnRunMasks, U8KeyPaddingMaskBlocksLikeBool) {
  SafetensorsWriter as_bool = query_writer();
  as_bool.add_raw("key_padding_mask", DType::kBool, {kB, kT},
                  integer_bytes(kPadding, DType::kBool));
  SafetensorsWriter as_u8 = query_writer();
  as_u8.add_raw("key_padding_mask", DType::kU8, {kB, kT}, integer_bytes(kPadding, DType::kU8, 3));
  EXPECT_EQ(output_of(as_u8), output_of(as_bool));
  EXPECT_NE(output_of(as_bool), output_of(query_writer()));  // the padding matters
}

// A float key_padding_mask (B, T_k) adds pad[b, k] to every score of key k, like an additive
// (B * H, T_q, T_k) attn_mask holding it for every head and query.
TEST(AttnRunMasks, FloatKeyPaddingMaskIsAdditive) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor<float, 2> pad({kB, kT}, {0.0f, 0.5f, -inf, -1.0f, 2.0f, 0.0f, 0.0f, -inf});
  Tensor<float, 3> additive({kB * kH, kT, kT});
  for (Index bh = 0; bh < kB * kH; ++bh) {
    for (Index i = 0; i < kT; ++i) {
      for (Index k = 0; k < kT; ++k) additive(bh, i, k) = pad(bh / kH, k);
    }
  }
  SafetensorsWriter as_padding = query_writer();
  as_padding.add("key_padding_mask", pad);
  SafetensorsWriter as_attn_mask = query_writer();
  as_attn_mask.add("attn_mask", additive);
  EXPECT_EQ(output_of(as_padding), output_of(as_attn_mask));
  EXPECT_NE(output_of(as_padding), output_of(query_writer()));
  // with --causal (a bound, not an attn_mask tensor) it stays additive
  Tensor<float, 3> causal_additive = additive;
  for (Index bh = 0; bh < kB * kH; ++bh) {
    for (Index i = 0; i < kT; ++i) {
      for (Index k = i + 1; k < kT; ++k) causal_additive(bh, i, k) = -inf;
    }
  }
  SafetensorsWriter as_causal_attn_mask = query_writer();
  as_causal_attn_mask.add("attn_mask", causal_additive);
  EXPECT_EQ(output_of(as_padding, /*causal=*/true), output_of(as_causal_attn_mask));
}

TEST(AttnRunMasks, FloatKeyPaddingMaskNextToAnAttnMaskIsAnError) {
  // PyTorch 1.13 ignores it next to a float attn_mask and reads it as boolean next to a
  // boolean one: no answer would match both its documentation and its output.
  for (const bool bool_attn_mask : {false, true}) {
    SafetensorsWriter w = query_writer();
    w.add("key_padding_mask", Tensor<float, 2>({kB, kT}));
    if (bool_attn_mask) {
      w.add("attn_mask", Tensor<bool, 2>({kT, kT}));
    } else {
      w.add("attn_mask", Tensor<float, 2>({kT, kT}));
    }
    EXPECT_THAT(
        attn::test::thrown<FormatError>([&] { output_of(w); }),
        HasSubstr("key_padding_mask is F32 (added to the scores) and an attn_mask is given too"));
  }
}

TEST(AttnRunMasks, KeyPaddingMaskShapeIsChecked) {
  SafetensorsWriter w = query_writer();
  w.add("key_padding_mask", Tensor<float, 2>({kB, kT + 1}));
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { output_of(w); }),
              HasSubstr("key_padding_mask has shape [2, 5], expected (B, T_k) = [2, 4]"));
}

TEST(AttnRunMasks, HugeBatchTimesHeadsIsAMismatchNotAnOverflow) {
  // a (2^62, 0, 1) query holds no element, so the file is valid; B * H overflows. The run
  // refuses the query itself (an empty axis, the wrong width) before any mask is read...
  SafetensorsWriter w;
  w.add_raw("query", DType::kF32, {Index(1) << 62, 0, 1}, {});
  w.add_raw("attn_mask", DType::kBool, {4, 0, 0}, {});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { output_of(w); }),
              HasSubstr("query has shape (4611686018427387904, 0, 1)"));
  // ...and the masks, given such extents, report a mismatch, not an overflow.
  attn_run::Masks<float> masks(Index(1) << 62, kH, 0, 0, /*batched=*/true);
  attn::AttentionMask<float> mask;
  const auto in = SafetensorsFile::from_bytes(w.to_bytes(), "x");
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { masks.read(in, mask); }),
              HasSubstr("expected (T_q, T_k) = [0, 0] or (B * num_heads, T_q, T_k) = (too large)"));
}

// ---- the command line ----

ParsedArguments parse(std::vector<std::string> argv) { return attn_run::parse_arguments(argv); }

TEST(AttnRunArguments, ParsesEveryFlag) {
  const ParsedArguments p =
      parse({"--weights", "w", "--input", "x", "--output", "y", "--num-heads", "4", "--prefix",
             "m.", "--causal", "--per-head-weights", "--double", "--backward"});
  ASSERT_EQ(p.action, ParsedArguments::Action::kRun) << p.error;
  EXPECT_EQ(p.arguments.weights, "w");
  EXPECT_EQ(p.arguments.run.num_heads, 4);
  EXPECT_EQ(p.arguments.run.prefix, "m.");
  EXPECT_TRUE(p.arguments.run.causal && p.arguments.run.need_weights && p.arguments.use_double);
  EXPECT_FALSE(p.arguments.run.average_weights);
  EXPECT_TRUE(p.arguments.run.backward);
  EXPECT_EQ(parse({"--output", "y", "--help"}).action, ParsedArguments::Action::kHelp);
}

// --backward checks grad_output's shape, then writes the output and the gradients: those of
// sum(output) without grad_output, twice as large with grad_output = 2 (linearity).
TEST(AttnRunBackward, ChecksGradOutputAndWritesEveryGradient) {
  RunOptions o;
  o.num_heads = kH;
  o.backward = true;
  SafetensorsWriter inputs = query_writer();
  inputs.add("grad_output", attn::test::random_tensor<float, 3>({kB, kT, kE + 1}, 8));
  const auto bad = SafetensorsFile::from_bytes(inputs.to_bytes(), "x");
  EXPECT_THAT(
      attn::test::thrown<FormatError>(
          [&] { attn_run::run_multi_head_attention<float>(weights(), bad, o); }),
      HasSubstr("'x': grad_output has shape [2, 4, 9], expected the output's shape [2, 4, 8]"));
  const auto ones = SafetensorsFile::from_bytes(query_writer().to_bytes(), "x");
  const auto y1 = SafetensorsFile::from_bytes(
      attn_run::run_multi_head_attention<float>(weights(), ones, o).to_bytes(), "y1");
  SafetensorsWriter twos = query_writer();
  attn::Tensor<float, 3> two({kB, kT, kE});
  two.fill(2.0f);
  twos.add("grad_output", two);
  const auto y2 = SafetensorsFile::from_bytes(
      attn_run::run_multi_head_attention<float>(
          weights(), SafetensorsFile::from_bytes(twos.to_bytes(), "x"), o)
          .to_bytes(),
      "y2");
  for (const char* name : {"output", "grad_query", "grad.in_proj_weight", "grad.in_proj_bias",
                           "grad.out_proj.weight", "grad.out_proj.bias"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(y1.contains(name));
    EXPECT_FALSE(y1.contains("grad_key"));
    const auto values = [&](const SafetensorsFile& f) {
      std::vector<float> v;
      if (f.rank(name) == 1) v = attn::test::to_vector(f.get<float, 1>(name));
      if (f.rank(name) == 2) v = attn::test::to_vector(f.get<float, 2>(name));
      if (f.rank(name) == 3) v = attn::test::to_vector(f.get<float, 3>(name));
      return v;
    };
    const std::vector<float> a = values(y1), b = values(y2);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    const float scale = std::string(name) == "output" ? 1.0f : 2.0f;
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(b[i], scale * a[i]);
  }
}

TEST(AttnRunArguments, UsageErrorsSayWhat) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--weights"}, "--weights needs a value"},
      {{"--bogus"}, "unknown argument '--bogus'"},
      {{"--num-heads", "0"}, "--num-heads expects a positive integer, got '0'"},
      {{"--num-heads", "3x"}, "got '3x'"},
      {{"--num-heads", "99999999999"}, "got '99999999999'"},
      {{"--input", "x", "--output", "y", "--num-heads", "2"}, "--weights is required"},
      {{"--weights", "w", "--input", "x", "--output", "y"}, "--num-heads is required"},
  };
  for (const auto& [argv, message] : cases) {
    const ParsedArguments p = parse(argv);
    EXPECT_EQ(p.action, ParsedArguments::Action::kError);
    EXPECT_THAT(p.error, HasSubstr(message));
  }
  std::ostringstream out, err;
  EXPECT_EQ(attn_run::main({"--bogus"}, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("attn_run: unknown argument '--bogus'"));
  EXPECT_EQ(attn_run::main({"--help"}, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("usage: attn_run"));
}

// DeepSeek-V3's value heads scaled down (4 query heads and 2 key/value heads of 6, values of
// 4; tests/fixtures/variants/, by scripts/variants_reference.py): attn_run reads the head
// sizes from the Llama names, and from nn.MultiheadAttention's fused names (in_proj_weight =
// q, k, v stacked: 44 rows, which 1 key/value head of 8 fits too) with --num-kv-heads or
// --head-dim, and gives PyTorch's causal output. Tolerance: double, rounding alone (the same
// module's fixture is measured within 1.4e-15 in tests/io/variants_fixtures_test.cpp);
// head sizes read wrongly move it by 1e-2 or more.
TEST(AttnRunValueHeads, RunsADeepSeekShapedFileUnderEitherNaming) {
  const SafetensorsFile fixture = SafetensorsFile::open(
      std::string(ATTN_IO_FIXTURES_DIR) + "/../variants/deepseek_value_heads_module.safetensors");
  attn::test::TempDir dir;
  SafetensorsWriter in;
  in.add("query", fixture.get<double, 3>("x"));
  in.save(dir.file("x.safetensors"));
  const std::vector<double> expected = fixture.values<double>("out");
  SafetensorsWriter fused;
  std::vector<double> weight, bias;
  for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
    const std::vector<double> w = fixture.values<double>(std::string("module.") + part + ".weight");
    const std::vector<double> b = fixture.values<double>(std::string("module.") + part + ".bias");
    weight.insert(weight.end(), w.begin(), w.end());
    bias.insert(bias.end(), b.begin(), b.end());
  }
  Tensor<double, 2> in_proj({44, 10});
  Tensor<double, 1> in_bias(attn::Shape<1>{44});
  ASSERT_EQ(weight.size(), static_cast<std::size_t>(in_proj.size()));
  std::copy(weight.begin(), weight.end(), in_proj.data());
  std::copy(bias.begin(), bias.end(), in_bias.data());
  fused.add("in_proj_weight", in_proj);
  fused.add("in_proj_bias", in_bias);
  fused.add("out_proj.weight", fixture.get<double, 2>("module.o_proj.weight"));
  fused.add("out_proj.bias", fixture.get<double, 1>("module.o_proj.bias"));
  fused.save(dir.file("fused.safetensors"));
  const auto run = [&](const std::string& weights, std::vector<std::string> flags) {
    std::vector<std::string> argv{"--weights",   weights,
                                  "--input",     dir.file("x.safetensors"),
                                  "--output",    dir.file("y.safetensors"),
                                  "--num-heads", "4",
                                  "--causal",    "--double"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::ostringstream out, err;
    const int status = attn_run::main(argv, out, err);
    return std::pair{status, err.str()};
  };
  const std::string llama =
      std::string(ATTN_IO_FIXTURES_DIR) + "/../variants/deepseek_value_heads_module.safetensors";
  for (const auto& [weights, flags] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {llama, {"--prefix", "module."}},
           {llama, {"--prefix", "module.", "--value-head-dim", "4", "--num-kv-heads", "2"}},
           {dir.file("fused.safetensors"), {"--num-kv-heads", "2"}},
           {dir.file("fused.safetensors"), {"--head-dim", "6", "--value-head-dim", "4"}}}) {
    SCOPED_TRACE(weights + " " + flags.back());
    const auto [status, err] = run(weights, flags);
    ASSERT_EQ(status, 0) << err;
    const std::vector<double> y =
        SafetensorsFile::open(dir.file("y.safetensors")).values<double>("output");
    ASSERT_EQ(y.size(), expected.size());
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-14) << i;
  }
  // Without a head count the fused file is refused, listing the layouts; a value head size
  // the shapes contradict is refused naming both.
  auto [status, err] = run(dir.file("fused.safetensors"), {});
  EXPECT_EQ(status, 1);
  EXPECT_THAT(err, HasSubstr("in_proj_weight [44, 10] out_proj.weight [10, 16]: the fused rows "
                             "fit several layouts of num_heads=4: num_kv_heads=1 with "
                             "head_dim=8, num_kv_heads=2 with head_dim=6"));
  std::tie(status, err) = run(llama, {"--prefix", "module.", "--value-head-dim", "6"});
  EXPECT_EQ(status, 1);
  EXPECT_THAT(err, HasSubstr("value_head_dim=6 was given, the shapes give 4"));
}

// --dtype bf16: a BF16 state_dict and F32 inputs (rounded to nearest even as they load) run
// through MultiHeadAttention<bfloat16>, bit for bit what the module gives on the rounded query
// with the same key padding, written as BF16 (or widened to F32); the modes a bfloat16 module
// lacks are usage errors naming them.
TEST(AttnRunBf16, RunsTheBf16ModuleAndRefusesWhatItLacks) {
  using attn::bfloat16;
  attn::TorchGenerator gen(3);
  const auto module = attn::convert<bfloat16>(
      attn::MultiHeadAttention<float>(attn::MultiHeadAttentionOptions::pytorch(kE, kH), gen));
  SafetensorsWriter w;
  attn::io::save_state_dict(module, w);
  const auto bf16_weights = SafetensorsFile::from_bytes(w.to_bytes(), "w");
  ASSERT_EQ(bf16_weights.dtype("in_proj_weight"), DType::kBF16);
  const auto query = attn::test::random_tensor<float, 3>({kB, kT, kE}, 7);
  SafetensorsWriter inputs;
  inputs.add("query", query);
  inputs.add_raw("key_padding_mask", DType::kBool, {kB, kT}, integer_bytes(kPadding, DType::kBool));
  const auto in = SafetensorsFile::from_bytes(inputs.to_bytes(), "x");

  Tensor<bool, 2> padding({kB, kT});
  for (Index i = 0; i < padding.size(); ++i) padding.data()[i] = kPadding[i] != 0;
  attn::AttentionMask<float> mask;
  mask.key_padding(padding);
  const Tensor<bfloat16, 3> expected = module.forward(attn::convert<bfloat16>(query).view(), mask);

  const ParsedArguments p = parse({"--dtype", "bf16", "--weights", "w", "--input", "x", "--output",
                                   "y", "--num-heads", std::to_string(kH)});
  ASSERT_EQ(p.action, ParsedArguments::Action::kRun) << p.error;
  const auto y =
      SafetensorsFile::from_bytes(attn_run::run(p.arguments, bf16_weights, in).to_bytes());
  ASSERT_EQ(y.dtype("output"), DType::kBF16);
  const Tensor<bfloat16, 3> output = y.get<bfloat16, 3>("output");
  ASSERT_EQ(output.shape(), expected.shape());
  for (Index i = 0; i < output.size(); ++i) {
    ASSERT_EQ(output.data()[i].bits(), expected.data()[i].bits()) << "element " << i;
  }
  // The same weights in F32 (weights(): the float module of the same draws) load rounded to
  // the same bfloat16 module: the same bits.
  const auto y_from_f32 =
      SafetensorsFile::from_bytes(attn_run::run(p.arguments, weights(), in).to_bytes());
  EXPECT_EQ(y_from_f32.values<float>("output"), y.values<float>("output"));

  const ParsedArguments wide = parse({"--dtype", "bf16", "--output-dtype", "f32", "--weights", "w",
                                      "--input", "x", "--output", "y", "--num-heads", "2"});
  ASSERT_EQ(wide.action, ParsedArguments::Action::kRun) << wide.error;
  const auto y32 =
      SafetensorsFile::from_bytes(attn_run::run(wide.arguments, bf16_weights, in).to_bytes());
  ASSERT_EQ(y32.dtype("output"), DType::kF32);
  EXPECT_EQ(y32.values<float>("output"), y.values<float>("output"));  // widened exactly

  const std::vector<std::string> run_args = {"--weights",   "w", "--input", "x",   "--output", "y",
                                             "--num-heads", "2", "--dtype", "bf16"};
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--need-weights", "--need-weights is not supported with --dtype bf16"},
      {"--per-head-weights", "--per-head-weights is not supported with --dtype bf16"},
      {"--double", "--double and --dtype bf16 disagree"},
  };
  for (const auto& [flag, message] : refused) {
    std::vector<std::string> argv = run_args;
    argv.push_back(flag.substr(0, flag.find(' ')));
    if (flag.find(' ') != std::string::npos) argv.push_back(flag.substr(flag.find(' ') + 1));
    const ParsedArguments bad = parse(argv);
    EXPECT_EQ(bad.action, ParsedArguments::Action::kError) << flag;
    EXPECT_THAT(bad.error, HasSubstr(message));
  }
  EXPECT_THAT(parse({"--output-dtype", "f32", "--weights", "w", "--input", "x", "--output", "y",
                     "--num-heads", "2"})
                  .error,
              HasSubstr("--output-dtype needs --dtype bf16"));
  // --backward: the training forward's output has the inference forward's bits, and the
  // gradients (of sum(output), grad_output absent) come out as BF16 under PyTorch's names.
  std::vector<std::string> train_args = run_args;
  train_args.push_back("--backward");
  const ParsedArguments train = parse(train_args);
  ASSERT_EQ(train.action, ParsedArguments::Action::kRun) << train.error;
  const auto g =
      SafetensorsFile::from_bytes(attn_run::run(train.arguments, bf16_weights, in).to_bytes());
  EXPECT_EQ(g.values<float>("output"), y.values<float>("output"));
  for (const char* name : {"grad_query", "grad.in_proj_weight", "grad.in_proj_bias",
                           "grad.out_proj.weight", "grad.out_proj.bias"}) {
    ASSERT_TRUE(g.contains(name)) << name;
    EXPECT_EQ(g.dtype(name), DType::kBF16) << name;
  }
  // out_proj's bias gradient is the column sums of grad_output (ones): B T in each element,
  // exact in bfloat16.
  for (const float b : g.values<float>("grad.out_proj.bias")) {
    EXPECT_EQ(b, static_cast<float>(kB * kT));
  }

  std::ostringstream out, err;
  std::vector<std::string> weights_flag = run_args;
  weights_flag.push_back("--need-weights");
  EXPECT_EQ(attn_run::main(weights_flag, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--need-weights is not supported with --dtype bf16 (--dtype "
                                   "bf16 runs the mha format's forward and --backward"));
  RunOptions o;
  o.num_heads = kH;
  o.need_weights = true;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { attn_run::run_multi_head_attention<bfloat16>(bf16_weights, in, o); }),
              HasSubstr("a bfloat16 run has no attention weights"));
}

// --dtype fp16: as --dtype bf16, with MultiHeadAttention<float16> and F16 tensors: an F16
// state_dict and F32 inputs (rounded to nearest even as they load) give the module's bits on
// the rounded query, written as F16 (or widened to F32); an --output-dtype of the other
// 16-bit type and attention weights are usage errors naming fp16; --backward runs.
TEST(AttnRunBf16, RunsTheFp16ModuleAsTheBf16One) {
  using attn::float16;
  attn::TorchGenerator gen(3);
  const auto module = attn::convert<float16>(
      attn::MultiHeadAttention<float>(attn::MultiHeadAttentionOptions::pytorch(kE, kH), gen));
  SafetensorsWriter w;
  attn::io::save_state_dict(module, w);
  const auto fp16_weights = SafetensorsFile::from_bytes(w.to_bytes(), "w");
  ASSERT_EQ(fp16_weights.dtype("in_proj_weight"), DType::kF16);
  const auto query = attn::test::random_tensor<float, 3>({kB, kT, kE}, 7);
  SafetensorsWriter inputs;
  inputs.add("query", query);
  inputs.add_raw("key_padding_mask", DType::kBool, {kB, kT}, integer_bytes(kPadding, DType::kBool));
  const auto in = SafetensorsFile::from_bytes(inputs.to_bytes(), "x");
  Tensor<bool, 2> padding({kB, kT});
  for (Index i = 0; i < padding.size(); ++i) padding.data()[i] = kPadding[i] != 0;
  attn::AttentionMask<float> mask;
  mask.key_padding(padding);
  const Tensor<float16, 3> expected = module.forward(attn::convert<float16>(query).view(), mask);

  const ParsedArguments p = parse({"--dtype", "fp16", "--weights", "w", "--input", "x", "--output",
                                   "y", "--num-heads", std::to_string(kH)});
  ASSERT_EQ(p.action, ParsedArguments::Action::kRun) << p.error;
  const auto y =
      SafetensorsFile::from_bytes(attn_run::run(p.arguments, fp16_weights, in).to_bytes());
  ASSERT_EQ(y.dtype("output"), DType::kF16);
  const Tensor<float16, 3> output = y.get<float16, 3>("output");
  ASSERT_EQ(output.shape(), expected.shape());
  for (Index i = 0; i < output.size(); ++i) {
    ASSERT_EQ(output.data()[i].bits(), expected.data()[i].bits()) << "element " << i;
  }
  const auto y_from_f32 =
      SafetensorsFile::from_bytes(attn_run::run(p.arguments, weights(), in).to_bytes());
  EXPECT_EQ(y_from_f32.values<float>("output"), y.values<float>("output"));
  const ParsedArguments wide = parse({"--dtype", "fp16", "--output-dtype", "f32", "--weights", "w",
                                      "--input", "x", "--output", "y", "--num-heads", "2"});
  ASSERT_EQ(wide.action, ParsedArguments::Action::kRun) << wide.error;
  const auto y32 =
      SafetensorsFile::from_bytes(attn_run::run(wide.arguments, fp16_weights, in).to_bytes());
  ASSERT_EQ(y32.dtype("output"), DType::kF32);
  EXPECT_EQ(y32.values<float>("output"), y.values<float>("output"));  // widened exactly

  const std::vector<std::string> run_args = {"--weights",   "w", "--input", "x",   "--output", "y",
                                             "--num-heads", "2", "--dtype", "fp16"};
  std::vector<std::string> need_weights = run_args;
  need_weights.push_back("--need-weights");
  EXPECT_THAT(parse(need_weights).error,
              HasSubstr("--need-weights is not supported with --dtype fp16 (--dtype fp16 runs "
                        "the mha format's forward and --backward"));
  std::vector<std::string> backward = run_args;  // (its gradients: attn_run_backward_test.cpp)
  backward.push_back("--backward");
  EXPECT_EQ(parse(backward).action, ParsedArguments::Action::kRun) << parse(backward).error;
  std::vector<std::string> other = run_args;
  other.insert(other.end(), {"--output-dtype", "bf16"});
  EXPECT_THAT(parse(other).error, HasSubstr("--output-dtype bf16 needs --dtype bf16"));
}

TEST(AttnRunFiles, OutputOverInputFailingKeepsTheInput) {
  // `attn_run --output X --input X` used to truncate X first: a write failing partway (here
  // past a file size limit, SIGXFSZ ignored as attn_run does) destroyed the input.
  const attn::test::TempDir dir;
  const std::string w = dir.file("w.safetensors"), x = dir.file("x.safetensors");
  weights_writer().save(w);
  query_writer().save(x);
  const std::vector<char> before = attn::test::read_bytes(x);
  const int status = attn::test::run_in_child([&] {
    attn::set_num_threads(1);  // a forked child cannot use the parent's OpenMP thread pool
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{256, 256};  // the output alone is 256 bytes of data
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
    std::ostringstream out, err;
    const int code = attn_run::main(
        {"--weights", w, "--input", x, "--output", x, "--num-heads", "2", "--need-weights"}, out,
        err);
    return code == 1 && err.str().find("the file is unchanged") != std::string::npos ? 0 : 1;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(attn::test::read_bytes(x), before);
  EXPECT_THAT(dir.others("x.safetensors"), ::testing::ElementsAre("w.safetensors"));
}

TEST(AttnRunFiles, OutputOverInputSucceedingReplacesIt) {
  const attn::test::TempDir dir;
  const std::string w = dir.file("w.safetensors"), x = dir.file("x.safetensors");
  weights_writer().save(w);
  query_writer().save(x);
  std::ostringstream out, err;
  ASSERT_EQ(
      attn_run::main({"--weights", w, "--input", x, "--output", x, "--num-heads", "2"}, out, err),
      0)
      << err.str();
  const SafetensorsFile y = SafetensorsFile::open(x);
  EXPECT_EQ(y.values<float>("output"), output_of(query_writer()));
}

}  // namespace

}  // namespace attn_run_test

#include "support/bodies_end.hpp"
