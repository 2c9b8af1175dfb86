#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// scripts/onnx/run_ort.js: runs every ONNX `Attention` case made by scripts/onnx/make_cases.py
// through ONNX Runtime (the npm package onnxruntime-node, CPU execution provider, one intra-op
// thread) and writes what it returns. Run by scripts/onnx/regenerate.sh.
//
// Usage: node scripts/onnx/run_ort.js --ort DIR --cases OUT --work WORK
//   --ort DIR    the directory holding node_modules/onnxruntime-node (npm install
//                --ignore-scripts onnxruntime-node@1.30.0 --prefix DIR)
//   --cases OUT  the fixture directory: reads OUT/caseNNN/inputs.safetensors, writes
//                OUT/caseNNN/ort.safetensors (the outputs, in the order Y, present_key,
//                present_value, qk_matmul_output, float32, ONNX Runtime's shapes)
//   --work WORK  the scratch directory of make_cases.py: reads WORK/cases.txt and
//                WORK/caseNNN/model.onnx, writes WORK/caseNNN/ort_status.json
//                ({"ok": true, "version": "1.30.0"} or {"ok": false, "error": "..."}: the text
//                of the error ONNX Runtime raised while loading or running the model)
// A case whose mask ONNX Runtime does not take (make_cases.py wrote WORK/caseNNN/
// equivalent_model.onnx and equivalent_inputs.safetensors, the same case with the mask
// rewritten to an equivalent one ONNX Runtime takes) runs a second time with those, into
// OUT/caseNNN/ort_equivalent.safetensors and WORK/caseNNN/ort_equivalent_status.json.
// Inputs are fed under the names they have in inputs.safetensors (the operator's input
// names): F32 as float32, BOOL as bool, I64 as int64.
'use strict';

const fs = require('fs');
const path = require('path');

function die(msg) {
  process.stderr.write(`run_ort.js: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const a = {};
  for (let i = 0; i < argv.length; i += 2) {
    const key = {'--ort': 'ort', '--cases': 'cases', '--work': 'work'}[argv[i]];
    if (!key || i + 1 >= argv.length) die(`bad argument '${argv[i]}'`);
    a[key] = argv[i + 1];
  }
  for (const k of ['ort', 'cases', 'work']) if (!a[k]) die(`--${k} is required`);
  return a;
}

// safetensors: u64 little-endian header length, JSON header, raw little-endian data.
function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n;
  const out = {};
  for (const [name, h] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [b, e] = h.data_offsets;
    const bytes = new Uint8Array(buf.buffer.slice(buf.byteOffset + base + b, buf.byteOffset + base + e));
    out[name] = {dtype: h.dtype, shape: h.shape, bytes};
  }
  return out;
}

function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  const blobs = [];
  for (const [name, t] of tensors) {
    const bytes = Buffer.from(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength);
    header[name] = {dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes.length]};
    blobs.push(bytes);
    offset += bytes.length;
  }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - (Buffer.byteLength(text) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(text, 'utf8'), ...blobs]));
}

function toOrtTensor(ort, t) {
  const copy = t.bytes.slice();  // aligned copy
  switch (t.dtype) {
    case 'F32': return new ort.Tensor('float32', new Float32Array(copy.buffer), t.shape);
    case 'BOOL': return new ort.Tensor('bool', new Uint8Array(copy.buffer), t.shape);
    case 'I64': return new ort.Tensor('int64', new BigInt64Array(copy.buffer), t.shape);
    default: throw new Error(`unsupported input dtype ${t.dtype}`);
  }
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const pkg = path.join(path.resolve(a.ort), 'node_modules', 'onnxruntime-node');
  let ort, version;
  try {
    ort = require(pkg);
    version = require(path.join(pkg, 'package.json')).version;
  } catch (e) {
    die(`cannot load onnxruntime-node from ${pkg}: ${e.message}`);
  }
  ort.env.logLevel = 'fatal';  // errors are recorded per case, not printed
  const names = fs.readFileSync(path.join(a.work, 'cases.txt'), 'utf8').split(/\s+/).filter(Boolean);
  const order = ['Y', 'present_key', 'present_value', 'qk_matmul_output'];
  let ok = 0, eqRuns = 0, eqOk = 0;
  // One run: a model, its inputs, where its outputs and its status go.
  async function run(model, inputsFile, ortFile, statusFile) {
    if (fs.existsSync(ortFile)) fs.unlinkSync(ortFile);
    let status;
    try {
      const inputs = readSafetensors(inputsFile);
      const feeds = {};
      for (const [k, t] of Object.entries(inputs)) feeds[k] = toOrtTensor(ort, t);
      const session = await ort.InferenceSession.create(model, {
        executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1,
        executionMode: 'sequential', logSeverityLevel: 4,
      });
      const result = await session.run(feeds);
      const outs = [];
      for (const k of order) {
        if (!(k in result)) continue;
        const t = result[k];
        if (t.type !== 'float32') throw new Error(`output ${k} has type ${t.type}`);
        outs.push([k, {dtype: 'F32', shape: t.dims.map(Number),
                       bytes: new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength)}]);
      }
      writeSafetensors(ortFile, outs);
      await session.release();
      status = {ok: true, version};
    } catch (e) {
      status = {ok: false, version, error: String(e && e.message ? e.message : e)};
    }
    fs.writeFileSync(statusFile, JSON.stringify(status, null, 1) + '\n');
    return status.ok;
  }
  for (const name of names) {
    const dir = path.join(a.cases, name);
    const work = path.join(a.work, name);
    if (await run(path.join(work, 'model.onnx'), path.join(dir, 'inputs.safetensors'),
                  path.join(dir, 'ort.safetensors'), path.join(work, 'ort_status.json'))) ++ok;
    // A case whose mask ONNX Runtime does not take also runs with an equivalent mask.
    const eqFile = path.join(dir, 'ort_equivalent.safetensors');
    if (fs.existsSync(path.join(work, 'equivalent_model.onnx'))) {
      ++eqRuns;
      if (await run(path.join(work, 'equivalent_model.onnx'), path.join(work, 'equivalent_inputs.safetensors'),
                    eqFile, path.join(work, 'ort_equivalent_status.json'))) ++eqOk;
    } else if (fs.existsSync(eqFile)) {
      fs.unlinkSync(eqFile);
    }
  }
  process.stdout.write(`run_ort.js: onnxruntime-node ${version}: ${ok} of ${names.length} cases ran, ` +
                       `${names.length - ok} raised an error; ${eqOk} of ${eqRuns} ran with an equivalent mask\n`);
}

main().catch((e) => die(e.stack || String(e)));
