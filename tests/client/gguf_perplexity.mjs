// gguf_perplexity.mjs — llama.cpp itself (node-llama-cpp's prebuilt CPU library) reads a GGUF
// file and scores a text under ptqkit's perplexity protocol, for tests/test_client.cpp:
//   the whole text tokenized with the file's own vocabulary, one BOS in front; non-overlapping
//   windows of CTX tokens from the start (the remainder dropped); in each window every token but
//   the first scored, -log softmax(logits)[next], in fp64 from llama.cpp's raw fp32 logits.
// usage: node gguf_perplexity.mjs MODEL.gguf TEXT CTX MAX_WINDOWS [IDS_OUT]
// with NODE_LLAMA_CPP_DIR the folder npm installed node-llama-cpp into (scripts/setup.sh: .client/).
// Prints one JSON line: {"tokens", "windows", "scored", "nll", "perplexity", "vocab", "bos"}.
// IDS_OUT: the token ids of the whole text (BOS first), one per line.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const pkg = path.join(process.env.NODE_LLAMA_CPP_DIR ?? ".client", "node_modules/node-llama-cpp/dist/index.js");
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(path.resolve(pkg)).href);

// Second mode: node gguf_perplexity.mjs --logits MODEL.gguf IDS OUT.f32 — each line of IDS one
// sequence of token ids, evaluated from an empty cache; llama.cpp's logits at every position
// written to OUT.f32 as float32 [sequences x positions, vocab] (token-id order).
if (process.argv[2] === "--logits") {
  const [modelPath, idsPath, outPath] = process.argv.slice(3);
  const pkg = path.join(process.env.NODE_LLAMA_CPP_DIR ?? ".client", "node_modules/node-llama-cpp/dist/index.js");
  const { getLlama, LlamaLogLevel } = await import(pathToFileURL(path.resolve(pkg)).href);
  const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
                                 logLevel: LlamaLogLevel.error, progressLogs: false });
  const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
  const seqs = fs.readFileSync(idsPath, "utf8").trim().split("\n").map((l) => l.trim().split(/\s+/).map(Number));
  const T = Math.max(...seqs.map((s) => s.length));
  // (room beyond the longest sequence: a full context would shift, and the last position come out wrong)
  const context = await model.createContext({ contextSize: T + 32, batchSize: T + 32, sequences: 1 });
  const sequence = context.getSequence();
  const rows = [];
  let V = 0;
  for (const s of seqs) {
    await sequence.clearHistory();
    const out = await sequence.controlledEvaluate(s.map((t) => [t, { generateNext: { logits: true } }]));
    for (const o of out) {
      const m = o?.next?.logits;
      if (!m) throw new Error("no logits");
      for (const k of m.keys()) V = Math.max(V, k + 1);
      rows.push(m);
    }
  }
  const buf = new Float32Array(rows.length * V);
  rows.forEach((m, i) => { for (const [k, v] of m) buf[i * V + k] = v; });
  fs.writeFileSync(outPath, Buffer.from(buf.buffer));
  console.log(JSON.stringify({ rows: rows.length, vocab: V }));
  await context.dispose();
  await model.dispose();
  process.exit(0);
}
const [modelPath, textPath, ctxArg, maxArg, idsOut, protocol] = process.argv.slice(2);
// protocol "llama.cpp": llama-perplexity's: each window's first token replaced by BOS, and only
// the predictions from position CTX/2 on scored.
const llamaCpp = protocol === "llama.cpp";
if (!modelPath || !textPath) {
  console.error("usage: node gguf_perplexity.mjs MODEL.gguf TEXT CTX MAX_WINDOWS [IDS_OUT]");
  process.exit(2);
}
const L = Number(ctxArg ?? 256), maxWindows = Number(maxArg ?? -1);
const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
                               logLevel: LlamaLogLevel.error, progressLogs: false });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({ contextSize: L + 32, batchSize: L + 32, sequences: 1 });   // (room: a full context shifts)
const sequence = context.getSequence();

const text = fs.readFileSync(textPath, "utf8");
const bos = model.tokens.bos;
const ids = (bos == null ? [] : [bos]).concat(Array.from(model.tokenize(text)));
if (idsOut) fs.writeFileSync(idsOut, ids.join("\n") + "\n");
let windows = Math.floor(ids.length / L);
if (maxWindows >= 0) windows = Math.min(windows, maxWindows);

let nll = 0, scored = 0;
for (let w = 0; w < windows; ++w) {
  await sequence.clearHistory();
  const win = ids.slice(w * L, (w + 1) * L);
  if (llamaCpp) win[0] = bos;
  const first = llamaCpp ? Math.floor(L / 2) : 0;
  const input = win.map((t, i) => (i < L - 1 ? [t, { generateNext: { logits: true } }] : t));
  const out = await sequence.controlledEvaluate(input);
  for (let i = first; i < L - 1; ++i) {
    const logits = out[i]?.next?.logits;
    if (!logits) throw new Error(`no logits at window ${w} position ${i}`);
    let max = -Infinity;
    for (const v of logits.values()) if (v > max) max = v;
    let sum = 0;
    for (const v of logits.values()) sum += Math.exp(v - max);
    const target = logits.get(win[i + 1]);
    if (target === undefined) throw new Error(`no logit for token ${win[i + 1]}`);
    nll += max + Math.log(sum) - target;
    ++scored;
  }
}
console.log(JSON.stringify({ tokens: ids.length, windows, scored, nll, perplexity: Math.exp(nll / scored),
                             vocab: model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length ?? null, bos }));
await context.dispose();
await model.dispose();
