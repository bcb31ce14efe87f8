#!/usr/bin/env python3
"""ptqkit's fake exports read by Hugging Face transformers: a check for a machine that has torch and
transformers (the GPU machine's image does; the development machines and CI do not).

For each shared model (every family): ptqkit quantizes it (GPTQ 4-bit, groups of 32, exported as
`fake`: dequantized weights in the source's layout and dtype, plus config.json), ptqkit generates
32 greedy tokens from the first 16 ids of its golden input (CPU, the reference path), and
transformers loads the export (AutoModelForCausalLM, fp32) and runs the prompt and those tokens in
one forward. Each generated token must be transformers' argmax at its position; where it is not,
the gap between transformers' top logit and that token's says whether it is a near-tie. The source
model is checked the same way first (the control).

    scripts/check_transformers.py PTQKIT ASSETS WORKDIR   (prints one line a model; exit 1 on a mismatch past a tie)
"""
import json
import os
import subprocess
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TIE = 1e-3   # a gap below this (logits of order 1-10, fp32 on both sides) is a near-tie, not a disagreement
RECIPE = """quantization: {method: gptq, bits: 4, group_size: 32, sym: false}
calibration: {dataset: random, samples: 8, seq_len: 64, seed: 0}
export: {format: [fake]}
"""


def greedy(ptqkit, model, prompt, json_path):
    subprocess.run([ptqkit, "-q", "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "32",
                    "--ignore-eos", "--no-bos", "--json", json_path], check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)["tokens"]


def check(model_dir, prompt, tokens):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = m(seq).logits[0]
    agree, worst_gap = 0, 0.0
    for i, t in enumerate(tokens):
        row = logits[len(prompt) - 1 + i]
        if int(row.argmax()) == t:
            agree += 1
        else:
            worst_gap = max(worst_gap, float(row.max() - row[t]))
    return agree, worst_gap


def main():
    ptqkit, assets, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    recipe = os.path.join(work, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write(RECIPE)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failed = False
    for name in ["llama2xs", "distilled-13m", "tiny-qwen3", "tiny-mixtral", "tiny-qwen3-moe", "tiny-phi3"]:
        src = os.path.join(assets, "models", name)
        ids = load_file(os.path.join(assets, "golden", f"golden-{name}.safetensors"))["input_ids"].reshape(-1).tolist()
        prompt = ids[:16]
        out = os.path.join(work, f"{name}-fake")
        subprocess.run([ptqkit, "-q", "quantize", recipe, "--model", src, "--output", out, "--force"], check=True, stdout=subprocess.DEVNULL)
        seen = {}
        for label, d in [("float", src), ("fake", out)]:
            tokens = seen[label] = greedy(ptqkit, d, prompt, os.path.join(work, f"{name}-{label}.json"))
            agree, gap = check(d, prompt, tokens)
            bad = agree < len(tokens) and gap > TIE
            failed |= bad
            moved = "" if label == "float" else f" (4-bit weights moved {sum(a != b for a, b in zip(seen['float'], tokens))} of them from the float model's)"
            print(f"{name} {label}: {agree} of {len(tokens)} greedy tokens are transformers' argmax{moved}"
                  + ("" if agree == len(tokens) else f"; largest gap where not {gap:.2e}" + (" (MISMATCH)" if bad else " (near-ties)")))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
