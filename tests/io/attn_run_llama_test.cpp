// SPDX-License-Identifier: MIT
// tests/io/attn_run_llama_test.cpp: `attn_run --format llama` (tools/attn_run/llama.hpp)
// reproduces Hugging Face's LlamaAttention as scripts/llama_reference.py writes it in PyTorch
// 1.13, on the committed fixtures (tests/fixtures/io/llama/, written by
// scripts/parity_vs_pytorch.py: both RoPE conventions, partial rotary, biases, a prefix with
// an old checkpoint's rotary_emb.inv_freq, float and double), without Python; its arguments;
// and its errors; and that prefill/chunk splits agree with one prefill; --dtype bf16 and fp16.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/fixture_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace attn_run_llama_test {
namespace {

using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using attn_run::ParsedArguments;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kDir = std::string(ATTN_IO_FIXTURES_DIR) + "/llama";

// attn_run's arguments from a fixture's recorded flags (file names are placeholders).
attn_run::Arguments arguments_of(const std::string& flags) {
  std::vector<std::string> argv{"--weights", "w", "--input", "x", "--output", "y"};
  std::istringstream in(flags);
  for (std::string flag; in >> flag;) argv.push_back(flag);
  const ParsedArguments parsed = attn_run::parse_arguments(argv);
  EXPECT_EQ(parsed.action, ParsedArguments::Action::kRun) << parsed.error;
  return parsed.arguments;
}

// max |got - want| / max |want| of `output`.
double relative_error(const SafetensorsWriter& result, const SafetensorsFile& expected) {
  const auto got = SafetensorsFile::from_bytes(result.to_bytes()).values<double>("output");
  const auto want = expected.values<double>("output");
  EXPECT_EQ(got.size(), want.size());
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(got[i] - want[i]));
    EXPECT_TRUE(std::isfinite(got[i]));
  }
  return err / std::max(scale, 1e-30);
}

TEST(AttnRunLlama, EveryFixtureMatchesTheReference) {
  const std::vector<std::string> cases = attn::test::fixture_cases(kDir);
  ASSERT_GE(cases.size(), 5u) << "fixtures missing in " << kDir;
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const attn::test::Fixture f(kDir, name);
    const std::string flags = f.expected.metadata().at("flags");
    const attn_run::Arguments args = arguments_of(flags);
    ASSERT_TRUE(args.llama) << flags;
    // The tolerance of scripts/parity_vs_pytorch.py (1e-5 relative in float).
    const double tol = args.use_double ? 1e-12 : 1e-5;
    EXPECT_LE(relative_error(attn_run::run(args, f.weights, f.input), f.expected), tol)
        << f.expected.metadata().at("case");
  }
}

TEST(AttnRunLlama, TheWrongRopeConventionIsFarOff) {
  // llama001: interleaved pairs, a prefix and an old checkpoint's rotary_emb.inv_freq.
  const attn::test::Fixture f(kDir, "llama001");
  attn_run::Arguments args = arguments_of(f.expected.metadata().at("flags"));
  ASSERT_TRUE(args.llama_options.rope_interleaved);
  EXPECT_TRUE(f.weights.contains(args.llama_options.prefix + "rotary_emb.inv_freq"));
  EXPECT_LE(relative_error(attn_run::run(args, f.weights, f.input), f.expected), 1e-5);
  args.llama_options.rope_interleaved = false;
  EXPECT_GT(relative_error(attn_run::run(args, f.weights, f.input), f.expected), 1e-2);
  args.llama_options.rope_interleaved = true;
  args.llama_options.rope_theta = 20000.0;
  EXPECT_GT(relative_error(attn_run::run(args, f.weights, f.input), f.expected), 1e-3);
}

// A small Llama layer's state_dict: 4 query heads of 4 over D = 16, kv_heads key/value heads.
// value_head_dim: value heads of their own size (0: 4).
SafetensorsFile llama_weights(attn::Index kv_heads, const std::string& extra = "",
                              attn::Index value_head_dim = 0) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 16;
  o.num_heads = 4;
  o.num_kv_heads = kv_heads;
  o.value_head_dim = value_head_dim;
  attn::TorchGenerator gen(5);
  const attn::MultiHeadAttention<float> m(o, gen);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w, "", attn::ParameterNames::kLlama);
  if (!extra.empty()) w.add(extra, attn::Tensor<float, 1>({2}));
  return SafetensorsFile::from_bytes(w.to_bytes(), "w.safetensors");
}

SafetensorsFile hidden_states(attn::Index tokens = 6) {
  SafetensorsWriter w;
  attn::Tensor<float, 3> x({2, tokens, 16});  // distinct tokens in [-1, 1]
  for (attn::Index i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.37f * static_cast<float>(i));
  w.add("query", x);
  return SafetensorsFile::from_bytes(w.to_bytes(), "x.safetensors");
}

TEST(AttnRunLlama, ErrorsNameTheFileAndTheValues) {
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  EXPECT_NO_THROW(attn_run::run_llama<float>(llama_weights(4), hidden_states(), o));
  o.num_kv_heads = 2;
  EXPECT_THAT(
      attn::test::thrown<std::invalid_argument>(
          [&] { attn_run::run_llama<float>(llama_weights(4), hidden_states(), o); }),
      AllOf(HasSubstr("--num-kv-heads 2 does not fit 'w.safetensors'"), HasSubstr("gives 4")));
  o.num_kv_heads = 0;
  o.head_dim = 8;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { attn_run::run_llama<float>(llama_weights(4), hidden_states(), o); }),
              HasSubstr("--head-dim 8 does not fit"));
  o.head_dim = 0;
  o.prefix = "model.";
  EXPECT_THAT(attn::test::thrown<attn::io::FormatError>(
                  [&] { attn_run::run_llama<float>(llama_weights(4), hidden_states(), o); }),
              HasSubstr("has no 'model.q_proj.weight'"));
  o.prefix = "";
  EXPECT_THAT(attn::test::thrown<attn::io::StateDictError>([&] {
                attn_run::run_llama<float>(llama_weights(4, "lm_head.bias"), hidden_states(), o);
              }),
              HasSubstr("unexpected tensor 'lm_head.bias'"));
  o.rotary_dim = 3;
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { attn_run::run_llama<float>(llama_weights(4), hidden_states(), o); }),
              HasSubstr("rotary_dim=3"));
}

// Every split of the sequence (one prefill, token by token, chunks; with grouped-query heads
// and a window) gives the whole-sequence result to float rounding (a few eps of the outputs,
// which are O(1) here: 1e-5 is the parity tolerance); a wrong split would be off by 1e-2.
TEST(AttnRunLlama, PrefillAndChunkSplitsAgree) {
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  for (const attn::Index kv_heads : {attn::Index(4), attn::Index(2), attn::Index(1)}) {
    for (const attn::Index window : {attn::Index(0), attn::Index(3)}) {
      SCOPED_TRACE("kv_heads " + std::to_string(kv_heads) + " window " + std::to_string(window));
      o.sliding_window = window;
      o.prefill = 0;
      const SafetensorsFile whole = SafetensorsFile::from_bytes(
          attn_run::run_llama<float>(llama_weights(kv_heads), hidden_states(9), o).to_bytes());
      for (const auto& [prefill, chunk] :
           std::vector<std::pair<attn::Index, attn::Index>>{{1, 1}, {4, 1}, {2, 3}, {5, 4}}) {
        o.prefill = prefill;
        o.chunk = chunk;
        EXPECT_LE(
            relative_error(attn_run::run_llama<float>(llama_weights(kv_heads), hidden_states(9), o),
                           whole),
            1e-5)
            << "prefill " << prefill << " chunk " << chunk;
      }
    }
  }
  o.sliding_window = 0;
  o.prefill = 10;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { attn_run::run_llama<float>(llama_weights(4), hidden_states(9), o); }),
              HasSubstr("do not fit T=9"));
}

// Value heads of 2 beside query and key heads of 4 (DeepSeek's shape, read from v_proj's
// rows): every cache takes them, so every split, a window's ring and a paged cache give the
// one-prefill result (to float rounding, as above; the paged cache without a window the same
// bits); a --value-head-dim the shapes contradict is refused.
TEST(AttnRunLlama, ValueHeadsOfTheirOwnSizeRunThroughEveryCache) {
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  const SafetensorsFile weights = llama_weights(2, "", 2), x = hidden_states(9);
  EXPECT_EQ(weights.shape("v_proj.weight"), (std::vector<attn::Index>{4, 16}));
  for (const attn::Index window : {attn::Index(0), attn::Index(3)}) {
    SCOPED_TRACE("window " + std::to_string(window));
    o.sliding_window = window;
    o.prefill = 0, o.chunk = 1, o.paged_block = 0;
    const SafetensorsFile whole =
        SafetensorsFile::from_bytes(attn_run::run_llama<float>(weights, x, o).to_bytes());
    o.prefill = 2, o.chunk = 3;
    EXPECT_LE(relative_error(attn_run::run_llama<float>(weights, x, o), whole), 1e-5);
    o.paged_block = 4;
    double error = -1;
    attn_run::run_llama<float>(weights, x, o, &error);
    EXPECT_LE(error, window == 0 ? 0.0 : 1e-6);
  }
  o.value_head_dim = 4;
  EXPECT_THAT(
      attn::test::thrown<std::invalid_argument>([&] { attn_run::run_llama<float>(weights, x, o); }),
      AllOf(HasSubstr("--value-head-dim 4 does not fit"), HasSubstr("gives 2")));
}

TEST(AttnRunLlama, APagedCacheReportsItsErrorAgainstTheContiguousOne) {
  // --paged 4: float rows give the same bits as the contiguous cache (error 0) without a
  // window; with a window of 3 the contiguous cache is a ring whose wrap splits the kernel's
  // key tiles (another summation order, ~1e-7). int8 rows paged give int8's error (2e-2:
  // kv_cache_quantized_test's bound).
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  o.prefill = 5, o.chunk = 2, o.paged_block = 4;
  for (const attn::Index window : {attn::Index(0), attn::Index(3)}) {
    o.sliding_window = window;
    double error = -1;
    const SafetensorsFile paged = SafetensorsFile::from_bytes(
        attn_run::run_llama<float>(llama_weights(2), hidden_states(9), o, &error).to_bytes());
    EXPECT_EQ(paged.metadata().at("kv_paged_block"), "4");
    if (window == 0) {
      EXPECT_EQ(error, 0.0);
    } else {
      EXPECT_LT(error, 1e-6);
    }
  }
  o.kv_element = attn::KVElement::kInt8;
  double error = -1;
  attn_run::run_llama<float>(llama_weights(2), hidden_states(9), o, &error);
  EXPECT_GT(error, 0.0);
  EXPECT_LT(error, 2e-2);
  EXPECT_EQ(arguments_of("--format llama --num-heads 4 --paged 16").llama_options.paged_block, 16);
  const ParsedArguments e = attn_run::parse_arguments(
      {"--weights", "w", "--input", "x", "--output", "y", "--num-heads", "2", "--paged", "0"});
  EXPECT_EQ(e.action, ParsedArguments::Action::kError);
  EXPECT_THAT(e.error, HasSubstr("--paged expects a positive block size"));
}

// --sink-tokens S with --sliding-window W: the first S + W rows are the full-attention ones
// (every token is kept), the later ones differ from both full attention and the window alone
// (the sinks and the window at cache positions), every split gives the same rows (to float
// rounding, as above), and with S + W >= T nothing is evicted.
TEST(AttnRunLlama, SinkTokensKeepTheFirstTokensBesideTheWindow) {
  const ParsedArguments p = attn_run::parse_arguments(
      {"--format", "llama", "--weights", "w", "--input", "x", "--output", "y", "--num-heads", "4",
       "--sliding-window", "3", "--sink-tokens", "2"});
  ASSERT_EQ(p.action, ParsedArguments::Action::kRun) << p.error;
  EXPECT_EQ(p.arguments.llama_options.sink_tokens, 2);
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  const attn::Index tokens = 12, d = 16;
  const auto rows = [&](const SafetensorsWriter& w) {
    return SafetensorsFile::from_bytes(w.to_bytes()).values<double>("output");  // (2, T, d)
  };
  const SafetensorsFile weights = llama_weights(2), x = hidden_states(tokens);
  const std::vector<double> full = rows(attn_run::run_llama<float>(weights, x, o));
  o.sliding_window = 3;
  const std::vector<double> window = rows(attn_run::run_llama<float>(weights, x, o));
  o.sink_tokens = 2;
  const SafetensorsWriter sinks = attn_run::run_llama<float>(weights, x, o);
  const std::vector<double> got = rows(sinks);
  ASSERT_EQ(got.size(), full.size());
  for (attn::Index b = 0; b < 2; ++b) {
    for (attn::Index t = 0; t < tokens; ++t) {
      double to_full = 0, to_window = 0;
      for (attn::Index e = 0; e < d; ++e) {
        const std::size_t i = static_cast<std::size_t>((b * tokens + t) * d + e);
        to_full = std::max(to_full, std::abs(got[i] - full[i]));
        to_window = std::max(to_window, std::abs(got[i] - window[i]));
      }
      if (t < 5) {
        EXPECT_LE(to_full, 1e-5) << "item " << b << " token " << t;
      } else {
        EXPECT_GT(std::min(to_full, to_window), 1e-3) << "item " << b << " token " << t;
      }
    }
  }
  for (const auto& [prefill, chunk] :
       std::vector<std::pair<attn::Index, attn::Index>>{{1, 1}, {4, 3}}) {
    o.prefill = prefill;
    o.chunk = chunk;
    EXPECT_LE(relative_error(attn_run::run_llama<float>(weights, x, o),
                             SafetensorsFile::from_bytes(sinks.to_bytes())),
              1e-5)
        << "prefill " << prefill << " chunk " << chunk;
  }
  o.prefill = 0;
  o.chunk = 1;
  o.sliding_window = 10;  // S + W = T: nothing is evicted
  EXPECT_EQ(rows(attn_run::run_llama<float>(weights, x, o)), full);
  o.sliding_window = 0;
  EXPECT_THAT(
      attn::test::thrown<std::invalid_argument>([&] { attn_run::run_llama<float>(weights, x, o); }),
      HasSubstr("--sink-tokens 2 goes with a --sliding-window (got 0)"));
}

// --dtype bf16 (fp16): the layer runs as a MultiHeadAttention<bfloat16> (<float16>) through a
// KVCache<bfloat16> (<float16>). The weights and hidden states are values of the type (a
// BF16 (F16) state_dict of the rounded float module, BF16 (F16) hidden states), so the float
// run reads the same values and the difference is the narrow run's own roundings: the Q, K
// and V projections, the rotation of Q and K, the probabilities, the context and the output
// projection, each at most u relative (the half ulp: 2^-9 for bfloat16, 2^-12 for float16;
// precision.md): the relative L2 error against the float run is below 8 u (1.6e-2, 2.0e-3:
// about one u per rounding and one for the scores' sensitivity; measured 3e-3 to 4e-3 for
// bfloat16, at most 3.3e-4 for float16), the same for every split, window and sinks. F32 files of
// the same values give the same bits, as does --kv-dtype bf16 (fp16: the same cache), and
// --output-dtype f32 widens them exactly.
template <class Element>
void check_narrow_llama_run() {
  constexpr bool kBf16 = std::is_same_v<Element, attn::bfloat16>;
  constexpr double kBound = kBf16 ? 8.0 / 512 : 8.0 / 4096;
  const std::string dtype = kBf16 ? "bf16" : "fp16";
  const attn::io::DType stored = kBf16 ? attn::io::DType::kBF16 : attn::io::DType::kF16;
  const auto narrowed = [](const SafetensorsFile& f, bool weights) {
    SafetensorsWriter w;
    if (weights) {
      attn::MultiHeadAttentionOptions o;
      o.d_in = 16;
      o.num_heads = 4;
      o.num_kv_heads = f.shape("k_proj.weight")[0] / 4;
      attn::MultiHeadAttention<Element> m(o);
      attn::io::load_state_dict(m, f, "", attn::io::Strict::kNo);
      attn::io::save_state_dict(m, w, "", attn::ParameterNames::kLlama);
    } else {
      w.add("query", attn::convert<Element>(f.get<float, 3>("query")));
    }
    return SafetensorsFile::from_bytes(w.to_bytes(), weights ? "w.safetensors" : "x.safetensors");
  };
  const auto widened = [](const SafetensorsFile& f) {  // the same values as F32
    SafetensorsWriter w;
    for (const std::string& name : f.names()) {
      if (f.rank(name) == 1) w.add(name, f.get<float, 1>(name));
      if (f.rank(name) == 2) w.add(name, f.get<float, 2>(name));
      if (f.rank(name) == 3) w.add(name, f.get<float, 3>(name));
    }
    return SafetensorsFile::from_bytes(w.to_bytes(), "f32.safetensors");
  };
  const auto values = [](const SafetensorsWriter& w) {
    return SafetensorsFile::from_bytes(w.to_bytes()).values<double>("output");
  };
  const SafetensorsFile x = narrowed(hidden_states(9), false);
  ASSERT_EQ(x.dtype("query"), stored);
  attn_run::LlamaOptions o;
  o.num_heads = 4;
  struct Setting {
    attn::Index kv_heads, window, sinks, prefill, chunk;
  };
  double worst = 0;
  for (const Setting& c : std::vector<Setting>{{4, 0, 0, 0, 1},
                                               {2, 0, 0, 4, 1},
                                               {1, 0, 0, 2, 3},
                                               {2, 3, 0, 0, 1},
                                               {2, 3, 0, 5, 2},
                                               {2, 3, 2, 4, 1}}) {
    SCOPED_TRACE("kv_heads " + std::to_string(c.kv_heads) + " window " + std::to_string(c.window) +
                 " sinks " + std::to_string(c.sinks) + " prefill " + std::to_string(c.prefill) +
                 " chunk " + std::to_string(c.chunk));
    o.sliding_window = c.window, o.sink_tokens = c.sinks, o.prefill = c.prefill, o.chunk = c.chunk;
    const SafetensorsFile w = narrowed(llama_weights(c.kv_heads), true);
    ASSERT_EQ(w.dtype("q_proj.weight"), stored);
    double reported = -1;
    const SafetensorsWriter y = attn_run::run_llama<Element>(w, x, o, &reported);
    const SafetensorsFile file = SafetensorsFile::from_bytes(y.to_bytes());
    ASSERT_EQ(file.dtype("output"), stored);
    EXPECT_EQ(file.metadata().at("dtype"), attn::element_name<Element>());
    // The float run on the same values, and the error the run reports against it.
    const std::vector<double> got = values(y), want = values(attn_run::run_llama<float>(w, x, o));
    ASSERT_EQ(got.size(), want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    EXPECT_NEAR(reported, std::sqrt(num / den), 1e-12);
    EXPECT_GT(reported, 0.0);
    EXPECT_LT(reported, kBound);
    worst = std::max(worst, reported);
    // The same values in F32 files: the same bits; a cache of the type asked for: the same
    // cache.
    EXPECT_EQ(values(attn_run::run_llama<Element>(widened(w), widened(x), o)), got);
    attn_run::LlamaOptions own_cache = o;
    own_cache.kv_element = attn::kv_element_of<Element>();
    EXPECT_EQ(values(attn_run::run_llama<Element>(w, x, own_cache)), got);
  }
  std::cout << "[ " << dtype << " llama ] worst relative error " << worst << "\n";
  // One prefill step through the KVCache<Element> gives the module's whole-sequence forward
  // (the same roundings, the same kernel call), bit for bit.
  {
    const SafetensorsFile w = narrowed(llama_weights(2), true);
    attn::MultiHeadAttentionOptions mo = attn::io::options_from_state_dict(w, 4, "");
    mo.causal = true;
    mo.rope = attn::RotaryOptions{4, 0, 10000.0, attn::RopeStyle::kHalfSplit, 9};
    attn::MultiHeadAttention<Element> m(mo);
    m.eval();
    attn::io::load_state_dict(m, w, "", attn::io::Strict::kYes);
    m.freeze();
    const attn::Tensor<Element, 3> whole = m.forward(x.get<Element, 3>("query").view());
    attn_run::LlamaOptions one;
    one.num_heads = 4;
    const attn::Tensor<Element, 3> stepped =
        SafetensorsFile::from_bytes(attn_run::run_llama<Element>(w, x, one).to_bytes())
            .template get<Element, 3>("output");
    ASSERT_EQ(stepped.shape(), whole.shape());
    for (attn::Index i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(stepped.data()[i].bits(), whole.data()[i].bits()) << "element " << i;
    }
  }
  // Through the command line: the error is printed, --output-dtype f32 writes the same values
  // widened, and the caches a narrow run does not keep are refused.
  const std::vector<std::string> base{"--format", "llama", "--dtype",  dtype, "--weights",   "w",
                                      "--input",  "x",     "--output", "y",   "--num-heads", "4"};
  const SafetensorsFile w = narrowed(llama_weights(2), true);
  const ParsedArguments narrow = attn_run::parse_arguments(base);
  ASSERT_EQ(narrow.action, ParsedArguments::Action::kRun) << narrow.error;
  std::vector<std::string> wide_argv = base;
  wide_argv.insert(wide_argv.end(), {"--output-dtype", "f32"});
  const ParsedArguments wide = attn_run::parse_arguments(wide_argv);
  ASSERT_EQ(wide.action, ParsedArguments::Action::kRun) << wide.error;
  double error = -1;
  const SafetensorsFile y16 =
      SafetensorsFile::from_bytes(attn_run::run(narrow.arguments, w, x, &error).to_bytes());
  const SafetensorsFile y32 =
      SafetensorsFile::from_bytes(attn_run::run(wide.arguments, w, x).to_bytes());
  EXPECT_GT(error, 0.0);
  EXPECT_EQ(y16.dtype("output"), stored);
  EXPECT_EQ(y32.dtype("output"), attn::io::DType::kF32);
  EXPECT_EQ(y32.values<float>("output"), y16.values<float>("output"));
  const std::string other = kBf16 ? "fp16" : "bf16";
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--kv-dtype", "int8"}, "--kv-dtype int8 is not supported with --dtype " + dtype},
           {{"--kv-dtype", other},
            "--kv-dtype " + other + " is not supported with --dtype " + dtype}}) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ParsedArguments e = attn_run::parse_arguments(argv);
    EXPECT_EQ(e.action, ParsedArguments::Action::kError) << message;
    EXPECT_THAT(e.error, HasSubstr(message));
  }
  std::vector<std::string> paged_argv = base;
  paged_argv.insert(paged_argv.end(), {"--paged", "4"});
  EXPECT_EQ(attn_run::parse_arguments(paged_argv).action, ParsedArguments::Action::kRun);
  // --paged 4 (steps of 5, then 2 tokens): a paged cache of the type's rows gives the
  // contiguous cache's bits without a window (the library's promise), and records its block.
  {
    attn_run::LlamaOptions p;
    p.num_heads = 4, p.prefill = 5, p.chunk = 2;
    const SafetensorsFile contiguous =
        SafetensorsFile::from_bytes(attn_run::run_llama<Element>(w, x, p).to_bytes());
    p.paged_block = 4;
    const SafetensorsFile paged =
        SafetensorsFile::from_bytes(attn_run::run_llama<Element>(w, x, p).to_bytes());
    EXPECT_EQ(paged.metadata().at("kv_paged_block"), "4");
    const attn::Tensor<Element, 3> a = contiguous.get<Element, 3>("output");
    const attn::Tensor<Element, 3> b = paged.get<Element, 3>("output");
    ASSERT_EQ(a.shape(), b.shape());
    for (attn::Index i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a.data()[i].bits(), b.data()[i].bits()) << "element " << i;
    }
  }
  o.sliding_window = o.sink_tokens = o.prefill = 0;
  o.kv_element = attn::KVElement::kInt8;
  const std::string name = attn::element_name<Element>();
  EXPECT_THAT(
      attn::test::thrown<std::invalid_argument>([&] { attn_run::run_llama<Element>(w, x, o); }),
      HasSubstr("a " + name + " run keeps its KV cache in " + name + " rows: --kv-dtype int8"));
}

TEST(AttnRunLlama, Bf16RunsThroughABf16CacheCloseToTheFloatRun) {
  check_narrow_llama_run<attn::bfloat16>();
}
TEST(AttnRunLlama, Fp16RunsThroughAnFp16CacheCloseToTheFloatRun) {
  check_narrow_llama_run<attn::float16>();
}

TEST(AttnRunLlama, ParsesItsFlagsAndRefusesTheOtherFormats) {
  const ParsedArguments p = attn_run::parse_arguments({"--format",
                                                       "llama",
                                                       "--weights",
                                                       "w",
                                                       "--input",
                                                       "x",
                                                       "--output",
                                                       "y",
                                                       "--num-heads",
                                                       "8",
                                                       "--num-kv-heads",
                                                       "2",
                                                       "--head-dim",
                                                       "64",
                                                       "--value-head-dim",
                                                       "48",
                                                       "--rope-theta",
                                                       "5e5",
                                                       "--rotary-dim",
                                                       "32",
                                                       "--rope-interleaved",
                                                       "--sliding-window",
                                                       "4096",
                                                       "--prefill",
                                                       "100",
                                                       "--chunk",
                                                       "16",
                                                       "--prefix",
                                                       "model.layers.0.self_attn.",
                                                       "--double"});
  ASSERT_EQ(p.action, ParsedArguments::Action::kRun) << p.error;
  const attn_run::LlamaOptions& l = p.arguments.llama_options;
  EXPECT_TRUE(p.arguments.llama && p.arguments.use_double && l.rope_interleaved);
  EXPECT_EQ(l.num_heads, 8);
  EXPECT_EQ(l.num_kv_heads, 2);
  EXPECT_EQ(l.head_dim, 64);
  EXPECT_EQ(l.value_head_dim, 48);
  EXPECT_EQ(l.rope_theta, 5e5);
  EXPECT_EQ(l.rotary_dim, 32);
  EXPECT_EQ(l.sliding_window, 4096);
  EXPECT_EQ(l.prefill, 100);
  EXPECT_EQ(l.chunk, 16);
  EXPECT_EQ(l.prefix, "model.layers.0.self_attn.");
  const std::vector<std::string> base{"--weights", "w", "--input",     "x",
                                      "--output",  "y", "--num-heads", "2"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> errors = {
      {{"--format", "gpt"}, "--format expects mha, llama or onnx, got 'gpt'"},
      {{"--rope-theta", "abc"}, "--rope-theta expects a positive number, got 'abc'"},
      {{"--rope-theta", "-1"}, "got '-1'"},
      {{"--chunk", "0"}, "--chunk expects a positive integer, got '0'"},
      {{"--rope-interleaved"}, "--rope-interleaved needs --format llama"},
      {{"--value-head-dim", "0"}, "--value-head-dim expects a positive integer, got '0'"},
      {{"--format", "llama", "--causal"}, "--causal is not used with --format llama"},
      {{"--format", "llama", "--need-weights"}, "--need-weights is not used with --format llama"},
  };
  for (const auto& [flags, message] : errors) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ParsedArguments e = attn_run::parse_arguments(argv);
    EXPECT_EQ(e.action, ParsedArguments::Action::kError) << message;
    EXPECT_THAT(e.error, HasSubstr(message));
  }
}

}  // namespace
}  // namespace attn_run_llama_test

#include "support/bodies_end.hpp"
