// gguf_perplexity.mjs — llama.cpp itself (node-llama-cpp's prebuilt CPU library) reads a GGUF
// file and scores a text under ptqkit's perplexity protocol, for tests/test_client.cpp:
//   the whole text tokenized with the file's own vocabulary, one BOS in front; non-overlapping
//   windows of CTX tokens from the start (the remainder dropped); in each window every token but
//   the first scored, -log softmax(logits)[next], in fp64 from llama.cpp's raw fp32 logits.
// usage: node gguf_perplexity.mjs MODEL.gguf TEXT CTX MAX_WINDOWS [IDS_OUT [PROTOCOL]]
//        node gguf_perplexity.mjs --logits MODEL.gguf IDS OUT.f32
//        node gguf_perplexity.mjs --jobs JOBS.json
// with NODE_LLAMA_CPP_DIR the folder npm installed node-llama-cpp into (scripts/setup.sh: .client/).
// The first form prints one JSON line: {"tokens", "windows", "scored", "nll", "perplexity", "vocab",
// "bos"}; IDS_OUT gets the token ids of the whole text (BOS first), one per line. The second is
// described at `logits` below. The third runs several in one process (node and llama.cpp start
// once, each model file is loaded once): JOBS.json is an array of {"perplexity": {"model", "text",
// "ctx", "windows", "ids_out", "protocol"}} and {"logits": {"model", "ids", "out"}}, and each job
// prints its JSON line, in order.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const pkg = path.join(process.env.NODE_LLAMA_CPP_DIR ?? ".client", "node_modules/node-llama-cpp/dist/index.js");
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(path.resolve(pkg)).href);

// One thread for llama.cpp's evaluation. Its CPU default is at least 4 threads, which on CI's two
// cores spin against each other and against the test running beside this one: a 512-token window
// of distilled-13m took 0.85 s at the default, 0.08 s on 2 threads alone, 0.14 s on 1 thread
// beside a busy core (2 threads there: 0.23 s).
const kThreads = 1;

const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
                               logLevel: LlamaLogLevel.error, progressLogs: false });
const models = new Map();   // path -> the loaded model, for the jobs that share a file
async function loadModel(modelPath) {
  if (!models.has(modelPath)) models.set(modelPath, await llama.loadModel({ modelPath, gpuLayers: 0 }));
  return models.get(modelPath);
}

// Each line of IDS one sequence of token ids, evaluated from an empty cache; llama.cpp's logits at
// every position written to OUT as float32 [sequences x positions, vocab] (token-id order).
async function logits({ model: modelPath, ids: idsPath, out: outPath }) {
  const model = await loadModel(modelPath);
  const seqs = fs.readFileSync(idsPath, "utf8").trim().split("\n").map((l) => l.trim().split(/\s+/).map(Number));
  const T = Math.max(...seqs.map((s) => s.length));
  // (room beyond the longest sequence: a full context would shift, and the last position come out wrong)
  const context = await model.createContext({ contextSize: T + 32, batchSize: T + 32, sequences: 1, threads: kThreads });
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
  await context.dispose();
  return { rows: rows.length, vocab: V };
}

// protocol "llama.cpp": llama-perplexity's: each window's first token replaced by BOS, and only
// the predictions from position CTX/2 on scored.
async function perplexity({ model: modelPath, text: textPath, ctx, windows: maxWindows = -1, ids_out: idsOut, protocol }) {
  const model = await loadModel(modelPath);
  const L = Number(ctx ?? 256), llamaCpp = protocol === "llama.cpp";
  const text = fs.readFileSync(textPath, "utf8");
  const bos = model.tokens.bos;
  const ids = (bos == null ? [] : [bos]).concat(Array.from(model.tokenize(text)));
  if (idsOut) fs.writeFileSync(idsOut, ids.join("\n") + "\n");
  let windows = Math.floor(ids.length / L);
  if (Number(maxWindows) >= 0) windows = Math.min(windows, Number(maxWindows));
  let nll = 0, scored = 0;
  if (windows > 0) {
    const context = await model.createContext({ contextSize: L + 32, batchSize: L + 32, sequences: 1, threads: kThreads });   // (room: a full context shifts)
    const sequence = context.getSequence();
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
    await context.dispose();
  }
  return { tokens: ids.length, windows, scored, nll, perplexity: Math.exp(nll / scored),
           vocab: model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length ?? null, bos };
}

const argv = process.argv.slice(2);
let jobs;
if (argv[0] === "--jobs") jobs = JSON.parse(fs.readFileSync(argv[1], "utf8"));
else if (argv[0] === "--logits") jobs = [{ logits: { model: argv[1], ids: argv[2], out: argv[3] } }];
else if (argv.length >= 2) jobs = [{ perplexity: { model: argv[0], text: argv[1], ctx: argv[2], windows: argv[3], ids_out: argv[4], protocol: argv[5] } }];
else {
  console.error("usage: node gguf_perplexity.mjs MODEL.gguf TEXT CTX MAX_WINDOWS [IDS_OUT [PROTOCOL]] | --logits MODEL.gguf IDS OUT.f32 | --jobs JOBS.json");
  process.exit(2);
}
for (const job of jobs) console.log(JSON.stringify(job.logits ? await logits(job.logits) : await perplexity(job.perplexity)));
for (const m of models.values()) await m.dispose();
process.exit(0);
