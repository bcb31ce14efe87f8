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

const [modelPath, textPath, ctxArg, maxArg, idsOut] = process.argv.slice(2);
if (!modelPath || !textPath) {
  console.error("usage: node gguf_perplexity.mjs MODEL.gguf TEXT CTX MAX_WINDOWS [IDS_OUT]");
  process.exit(2);
}
const L = Number(ctxArg ?? 256), maxWindows = Number(maxArg ?? -1);
const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
                               logLevel: LlamaLogLevel.error, progressLogs: false });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({ contextSize: L, batchSize: L, sequences: 1 });
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
  const input = win.map((t, i) => (i < L - 1 ? [t, { generateNext: { logits: true } }] : t));
  const out = await sequence.controlledEvaluate(input);
  for (let i = 0; i < L - 1; ++i) {
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
