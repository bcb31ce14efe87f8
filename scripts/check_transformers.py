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

Then the forward's model features that no shared checkpoint has, on models transformers itself
makes (random weights, initializer_range 0.2, biases N(0, 0.2), saved with save_pretrained): Llama 3 rope scaling,
q/k/v/o biases with head_dim != hidden / heads, Mistral's sliding window, Qwen2's q/k/v biases,
Phi-3's partial rotary. `ptqkit eval --save-logits` keeps its top-16 log-probabilities of every
position of 4 windows of 256 tokens; transformers' log-probabilities of the same tokens at the
same ids must agree (fp32 on both sides). Beside each, how far the feature itself moves
transformers' log-probabilities (the same weights with the feature off), so that agreement means
ptqkit computes the feature, not merely something close to the model without it. Where a GPU is
present, ptqkit's GPU evaluation (`eval --device cuda`: bf16 GEMM operands for these fp32 models)
is compared the same way, within 0.1.

    scripts/check_transformers.py PTQKIT ASSETS WORKDIR   (one line a model; exit 1 on a mismatch past a tie, or a feature off by more than 1e-3)
"""
import json
import os
import shutil
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


def top_logp(model, tokens, seq_len, ids):
    """log-probabilities of `model` at ptqkit's saved top ids, window by window (row t predicts t + 1)."""
    out = []
    with torch.no_grad():
        for w in range(tokens.numel() // seq_len):
            x = tokens[w * seq_len:(w + 1) * seq_len].long().unsqueeze(0)
            lp = torch.log_softmax(model(x).logits[0, :-1].double(), dim=-1)
            out.append(lp.gather(1, ids[w * (seq_len - 1):(w + 1) * (seq_len - 1)].long()))
    return torch.cat(out)


def features(ptqkit, assets, work):
    from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config
    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, initializer_range=0.2, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    # (name, config, the same model with the feature off: a config, or "zero biases")
    cases = [("llama: llama3 rope scaling", LlamaConfig(**base, rope_parameters=llama3), LlamaConfig(**base)),
             ("llama: q/k/v/o biases, head_dim 32 (hidden 64, 4 heads)", LlamaConfig(**base, attention_bias=True, head_dim=32), "zero biases"),
             ("mistral: sliding window 16", MistralConfig(**base, sliding_window=16), MistralConfig(**base, sliding_window=None)),
             ("qwen2: q/k/v biases", Qwen2Config(**base), "zero biases"),
             ("qwen2: sliding window 16 on every layer (use_sliding_window, max_window_layers 0)",
              Qwen2Config(**base, use_sliding_window=True, sliding_window=16, max_window_layers=0), Qwen2Config(**base)),
             ("phi3: partial rotary 0.5", Phi3Config(**base, partial_rotary_factor=0.5), Phi3Config(**base, partial_rotary_factor=1.0))]
    synth = os.path.join(work, "synth-tokenizer")
    subprocess.run([ptqkit, "-q", "synth", "--preset", "micro", "--output", synth, "--force"], check=True, stdout=subprocess.DEVNULL)
    failed = False
    for i, (name, cfg, off) in enumerate(cases):
        d = os.path.join(work, f"feature-{i}")
        shutil.rmtree(d, ignore_errors=True)   # eval --save-logits refuses to replace a file
        torch.manual_seed(i)
        m = AutoModelForCausalLM.from_config(cfg).float().eval()
        with torch.no_grad():   # transformers initializes biases to zero: give them values, or their check is empty
            for k, v in m.named_parameters():
                if k.endswith(".bias"):
                    v.normal_(0.0, 0.2)
        m.save_pretrained(d)
        shutil.copy(os.path.join(synth, "tokenizer.json"), d)
        top = os.path.join(d, "top.safetensors")
        subprocess.run([ptqkit, "-q", "eval", "--model", d, "--data", os.path.join(assets, "text", "tinystories", "eval.txt"), "--seq-len", "256",
                        "--max-windows", "4", "--save-logits", top, "--save-logits-k", "16"], check=True, stdout=subprocess.DEVNULL)
        t = load_file(top)
        ref = t["top_logp"].double()
        got = top_logp(m, t["tokens"], 256, t["top_ids"])
        if off == "zero biases":
            m2 = AutoModelForCausalLM.from_config(cfg).float().eval()
            m2.load_state_dict({k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in m.state_dict().items()})
        else:
            m2 = AutoModelForCausalLM.from_config(off).float().eval()
            m2.load_state_dict(m.state_dict())
        moved = float((top_logp(m2, t["tokens"], 256, t["top_ids"]) - got).abs().max())
        diff = float((got - ref).abs().max())
        bad = diff > 1e-3
        failed |= bad
        print(f"{name}: ptqkit vs transformers max |d log p| {diff:.2e} over {ref.numel()} values; the feature moves transformers' by up to {moved:.2e}"
              + (" (MISMATCH)" if bad else ""))
        if torch.cuda.is_available():   # the GPU evaluation too: bf16 GEMMs for an fp32 model, so a looser bound
            gpu = os.path.join(d, "top-cuda.safetensors")
            subprocess.run([ptqkit, "-q", "eval", "--model", d, "--data", os.path.join(assets, "text", "tinystories", "eval.txt"), "--seq-len", "256",
                            "--max-windows", "4", "--save-logits", gpu, "--save-logits-k", "16", "--device", "cuda"], check=True, stdout=subprocess.DEVNULL)
            g = load_file(gpu)
            same_ids = bool(torch.equal(g["top_ids"], t["top_ids"]))
            got_g = top_logp(m, g["tokens"], 256, g["top_ids"])
            diff_g = float((got_g - g["top_logp"].double()).abs().max())
            bad_g = diff_g > 0.1
            failed |= bad_g
            print(f"  {name}, ptqkit eval --device cuda: max |d log p| {diff_g:.2e} against transformers' at its own top ids"
                  f" ({'the CPU run' + chr(39) + 's ids' if same_ids else 'ids differ from the CPU run' + chr(39) + 's in places'})" + (" (MISMATCH)" if bad_g else ""))
    # A mix of sliding and full layers (transformers: layers i >= max_window_layers slide): ptqkit
    # refuses it, naming the field, rather than computing one kind for every layer.
    cfg = Qwen2Config(**base, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    d = os.path.join(work, "feature-mixed")
    shutil.rmtree(d, ignore_errors=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    shutil.copy(os.path.join(synth, "tokenizer.json"), d)
    r = subprocess.run([ptqkit, "eval", "--model", d, "--data", os.path.join(assets, "text", "tinystories", "eval.txt"), "--max-windows", "1"],
                       capture_output=True, text=True)
    said = (r.stdout + r.stderr).strip().splitlines()
    refused = r.returncode != 0 and any("sliding-window" in x for x in said)
    failed |= not refused
    print(f"qwen2 with max_window_layers 1 of 2 (transformers' layer_types {getattr(cfg, 'layer_types', None)}): ptqkit exit {r.returncode}: "
          + (said[-1] if said else "") + ("" if refused else " (NOT REFUSED)"))
    return failed


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
    failed |= features(ptqkit, assets, work)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
