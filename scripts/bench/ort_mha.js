#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// scripts/bench/ort_mha.js: times ONNX Runtime (the npm package onnxruntime-node, CPU
// execution provider) on one multi-head-attention shape and prints the same
// machine-readable line as bench/mha_timer and scripts/bench/pytorch_mha.py. Used by
// scripts/bench_vs_pytorch.sh, one fresh process per measurement so RSS is per shape.
//
// Usage: node scripts/bench/ort_mha.js B Tq Tk D H causal cross threads reps
//            --graphs DIR --ort DIR [--max-seconds S] [--warmup N] [--forms auto|a,b,...]
//            [--arena 0|1] [--mem-pattern 0|1] [--profile PREFIX]
//   --graphs DIR  the shape's directory written by scripts/bench/ort_graphs.py (its
//                 manifest.json names the graphs, the input and nn.MultiheadAttention's
//                 output on it)
//   --ort DIR     the directory holding node_modules/onnxruntime-node (npm install
//                 --ignore-scripts onnxruntime-node@1.30.0 --prefix DIR)
//   --warmup N    untimed runs per graph before timing (default 2: ONNX Runtime touches fresh
//                 memory on its first two runs)
//   --forms       graphs to time (default auto: every graph in the manifest, in its order);
//                 several are timed one after the other (each session released before the
//                 next loads: the materialising graphs hold GiBs at T = 8192) and the fastest
//                 is reported
//   --arena 0|1, --mem-pattern 0|1
//                 enableCpuMemArena / enableMemPattern (default 1 and 1, ONNX Runtime's own
//                 defaults)
//   --profile P   ONNX Runtime's profiler on (enableProfiling, profileFilePrefix P); the JSON
//                 files it writes (one per timed graph, warm-up runs included) are listed as
//                 profile=a.json,b.json (the timing then includes the profiler's overhead)
// Session options: intraOpNumThreads = threads, interOpNumThreads = 1, executionMode
// sequential, graphOptimizationLevel all, enableCpuMemArena and enableMemPattern as given
// (on by default, ONNX Runtime's defaults); intra-op threads spin while waiting (ORT's default), as attn's
// OpenMP threads do under OMP_WAIT_POLICY=ACTIVE.
// Each call is the binding's synchronous InferenceSession.run (onnxruntime-node's
// dist/binding, the object its public async run() wraps in a setImmediate), with the output
// tensor preallocated, so the time is ONNX Runtime's Run plus the binding's wrapping of the
// input and output buffers, not the event loop or an output copy.
// Check: the first warm-up output of every graph is compared with nn.MultiheadAttention's
// (|y - ref| <= 1e-4 + 1e-3 |ref| elementwise, pytorch_mha.py's tolerance); a graph that fails
// it, or fails to load or run, is skipped with a "skipped=<form> ... reason=..." line.
// Output: "variant=<form> ... reps=N" per graph that passed, then the result line
//   impl=ort B=.. Tq=.. Tk=.. D=.. H=.. causal=0 cross=0 threads=1 reps=20 median_ms=..
//   min_ms=.. gflops=.. max_rss_mib=.. base_rss_mib=.. variant=mha max_err=.. ort=1.30.0
// max_rss_mib: the process's peak resident set (process.resourceUsage().maxRSS);
// base_rss_mib: the same after node and ONNX Runtime are loaded, before any session exists.
// Exit status 3 when no graph passed.
'use strict';

const fs = require('fs');
const path = require('path');

const ATOL = 1e-4;
const RTOL = 1e-3;

function die(msg, code = 2) {
  process.stderr.write(`ort_mha.js: ${msg}\n`);
  process.exit(code);
}

function parseArgs(argv) {
  const names = ['B', 'Tq', 'Tk', 'D', 'H', 'causal', 'cross', 'threads', 'reps'];
  const a = {maxSeconds: 10, warmup: 2, forms: 'auto', graphs: null, ort: null, profile: null,
             arena: '1', memPattern: '1'};
  const pos = [];
  for (let i = 0; i < argv.length; ++i) {
    const opt = {'--max-seconds': 'maxSeconds', '--warmup': 'warmup', '--forms': 'forms',
                 '--graphs': 'graphs', '--ort': 'ort', '--profile': 'profile',
                 '--arena': 'arena', '--mem-pattern': 'memPattern'}[argv[i]];
    if (opt) {
      if (i + 1 >= argv.length) die(`${argv[i]} needs a value`);
      a[opt] = argv[++i];
    } else {
      pos.push(argv[i]);
    }
  }
  if (pos.length !== names.length) die(`expected ${names.length} positional arguments (${names.join(' ')})`);
  names.forEach((n, i) => {
    const v = Number(pos[i]);
    if (!Number.isInteger(v) || v < 0) die(`bad ${n} '${pos[i]}'`);
    a[n] = v;
  });
  a.maxSeconds = Number(a.maxSeconds);
  a.warmup = Math.max(1, Number(a.warmup) | 0);
  if (!a.graphs || !a.ort) die('--graphs and --ort are required');
  if (!a.cross && a.Tq !== a.Tk) die('self-attention (cross=0) needs Tk == Tq');
  if (a.D % a.H !== 0) die('D must be divisible by H');
  return a;
}

// bench/bench_support.hpp's formula (useful FLOPs, matrix products only); the same as in
// pytorch_mha.py and report.py.
function mhaFlops(b, tq, tk, d, h, causal, cross) {
  let pairs;
  if (!causal) pairs = tq * tk;
  else if (tq <= tk) pairs = tq * (tq + 1) / 2;
  else pairs = tk * (tk + 1) / 2 + (tq - tk) * tk;
  const proj = cross ? 2 * b * tq * d * d + 2 * b * tk * d * 2 * d : 2 * b * tq * d * 3 * d;
  return proj + 2 * b * tq * d * d + 4 * b * h * pairs * Math.floor(d / h);
}

const maxRssMib = () => process.resourceUsage().maxRSS / 1024;  // KiB on Linux

function readF32(file, expected) {
  const buf = fs.readFileSync(file);
  if (buf.byteLength !== expected * 4) die(`${file}: ${buf.byteLength} bytes, expected ${expected * 4}`);
  const out = new Float32Array(expected);
  new Uint8Array(out.buffer).set(buf);
  return out;
}

function median(xs) {
  const s = [...xs].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function maxErr(y, ref) {  // returns [max |y - ref|, whether every element is within tolerance]
  let err = 0;
  let ok = true;
  for (let i = 0; i < ref.length; ++i) {
    const e = Math.abs(y[i] - ref[i]);
    if (!(e <= ATOL + RTOL * Math.abs(ref[i]))) ok = false;  // NaN fails too
    if (!(e <= err)) err = e;
  }
  return [err, ok];
}

function main() {
  const a = parseArgs(process.argv.slice(2));
  const manifest = JSON.parse(fs.readFileSync(path.join(a.graphs, 'manifest.json'), 'utf8'));
  for (const k of ['B', 'Tq', 'Tk', 'D', 'H', 'causal', 'cross']) {
    if (manifest.shape[k] !== a[k]) die(`${a.graphs} holds ${k}=${manifest.shape[k]}, not ${a[k]}`);
  }
  const pkg = path.join(path.resolve(a.ort), 'node_modules', 'onnxruntime-node');
  let ort, binding, version;
  try {
    ort = require(pkg);
    binding = require(path.join(pkg, 'dist', 'binding'));
    version = require(path.join(pkg, 'package.json')).version;
  } catch (e) {
    die(`cannot load onnxruntime-node from ${pkg}: ${e.message}`);
  }
  binding.initOrt();
  const baseRss = maxRssMib();
  const shapeFields = `B=${a.B} Tq=${a.Tq} Tk=${a.Tk} D=${a.D} H=${a.H} causal=${a.causal} ` +
                      `cross=${a.cross} threads=${a.threads}`;

  const feeds = {};
  for (const [name, file] of Object.entries(manifest.inputs)) {
    const t = name === 'xkv' ? a.Tk : a.Tq;
    feeds[name] = new ort.Tensor('float32', readF32(path.join(a.graphs, file), a.B * t * a.D), [a.B, t, a.D]);
  }
  const outLen = a.B * a.Tq * a.D;
  const ref = readF32(path.join(a.graphs, manifest.reference), outLen);

  let names = manifest.forms.map((f) => f.name);
  if (a.forms !== 'auto') {
    const wanted = a.forms.split(',');
    for (const w of wanted) {
      if (!names.includes(w)) {
        const sk = manifest.skipped.find((s) => s.name === w);
        die(`form ${w} is not available for this shape` + (sk ? `: ${sk.reason}` : ''));
      }
    }
    names = wanted;
  }
  for (const sk of manifest.skipped) {
    if (a.forms === 'auto') console.log(`skipped=${sk.name} ${shapeFields} reason="${sk.reason}"`);
  }

  const options = {
    intraOpNumThreads: Math.max(1, a.threads), interOpNumThreads: 1, executionMode: 'sequential',
    graphOptimizationLevel: 'all', enableCpuMemArena: a.arena !== '0',
    enableMemPattern: a.memPattern !== '0',
    logSeverityLevel: 3,
  };
  if (a.profile) Object.assign(options, {enableProfiling: true, profileFilePrefix: a.profile});

  const flops = mhaFlops(a.B, a.Tq, a.Tk, a.D, a.H, a.causal, a.cross);
  const gf = (ms) => (flops / (ms * 1e-3) * 1e-9).toFixed(2);
  const timeRun = (session, fetches) => {
    const t0 = process.hrtime.bigint();
    session.run(feeds, fetches, {});
    return Number(process.hrtime.bigint() - t0) / 1e6;
  };

  // One graph at a time, each session released before the next one loads, so the process
  // holds one graph's buffers at a time (the materialising graphs need GiBs at T = 8192).
  const live = [];
  let profile = null;
  for (const name of names) {
    const file = path.join(a.graphs, manifest.forms.find((f) => f.name === name).file);
    const out = new Float32Array(outLen);
    const fetches = {[manifest.output]: new ort.Tensor('float32', out, [a.B, a.Tq, a.D])};
    let session = null;
    try {
      session = new binding.binding.InferenceSession();
      session.loadModel(file, options);
      // Warm-up 1 is the check.
      out.fill(NaN);
      timeRun(session, fetches);
      const [err, ok] = maxErr(out, ref);
      if (!ok) {
        console.log(`skipped=${name} ${shapeFields} reason="output differs from nn.MultiheadAttention ` +
                    `by up to ${err.toExponential(3)} (tolerance ${ATOL} + ${RTOL} |ref|)"`);
        continue;
      }
      for (let i = 1; i < a.warmup; ++i) timeRun(session, fetches);
      const times = [];
      let total = 0;
      for (let rep = 0; rep < Math.max(1, a.reps); ++rep) {
        times.push(timeRun(session, fetches));
        total += times[times.length - 1] / 1e3;
        if (total >= a.maxSeconds && times.length >= 3) break;
      }
      const f = {name, err, times, median: median(times)};
      live.push(f);
      console.log(`variant=${name} ${shapeFields} median_ms=${f.median.toFixed(4)} ` +
                  `min_ms=${Math.min(...times).toFixed(4)} gflops=${gf(f.median)} ` +
                  `max_err=${err.toExponential(2)} reps=${times.length}`);
      if (a.profile) {
        const p = session.endProfiling();
        if (typeof p === 'string') profile = profile ? `${profile},${p}` : p;
      }
    } catch (e) {
      const why = String(e.message || e).split('\n')[0].replace(/"/g, "'");
      console.log(`skipped=${name} ${shapeFields} reason="does not run: ${why}"`);
    } finally {
      if (session) session.dispose();
    }
  }
  if (live.length === 0) die('no graph ran and matched nn.MultiheadAttention', 3);
  const rss = maxRssMib();

  const best = live.reduce((x, y) => (y.median < x.median ? y : x));
  console.log(`impl=ort ${shapeFields} reps=${best.times.length} median_ms=${best.median.toFixed(4)} ` +
              `min_ms=${Math.min(...best.times).toFixed(4)} gflops=${gf(best.median)} ` +
              `max_rss_mib=${rss.toFixed(1)} base_rss_mib=${baseRss.toFixed(1)} variant=${best.name} ` +
              `max_err=${best.err.toExponential(2)} ort=${version}` + (profile ? ` profile=${profile}` : ''));
}

main();
