// generate.cpp — `ptqkit generate --model DIR --prompt TEXT`: text from any checkpoint ptqkit
// reads (float, every packed format, GGUF), greedy unless --temperature is given, streamed to
// stdout as it is decoded; timings (prefill and decode tokens/s) to stderr. The CPU path is the
// reference (model/generate.h).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "formats/open.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#ifdef PTQKIT_HAVE_CUDA
#include "cuda/runtime.h"
#include "eval/perplexity_cuda.h"
#endif

namespace ptq {

namespace {
struct GenerateArgs {
  std::string model, prompt, prompt_ids, tokenizer, json_out, device = "cpu";
  int max_tokens = 64;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
  bool ignore_eos = false, no_bos = false;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run(const GenerateArgs& a) {
  if (a.max_tokens < 0) fail(Errc::usage, "", "--max-tokens", "must be non-negative");
  if (a.temperature < 0) fail(Errc::usage, "", "--temperature", "must be non-negative (0: greedy)");
  if (!(a.top_p > 0 && a.top_p <= 1)) fail(Errc::usage, "", "--top-p", "must be in (0, 1]");
  const auto t_load = std::chrono::steady_clock::now();
  auto model = open_model(a.model);
  const LlamaConfig& c = model->config();
  if (a.prompt.empty() == a.prompt_ids.empty()) fail(Errc::usage, "", "--prompt", "give --prompt TEXT or --prompt-ids ID,ID,... (one of them)");
  // Token ids in, token ids out when the prompt is given as ids (checkpoints without a tokenizer).
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> ids;
  if (!a.prompt.empty()) {
    tok = cli_tokenizer(a.tokenizer, model->dir(), c.bos_token_id, "give one with --tokenizer FILE, or the prompt as --prompt-ids ID,ID,...");
    if (!a.no_bos && tok->bos_id >= 0) ids.push_back(tok->bos_id);
    for (int32_t t : tok->encode(a.prompt)) ids.push_back(t);
  } else {
    size_t p = 0;
    while (p < a.prompt_ids.size()) {
      size_t q = a.prompt_ids.find(',', p);
      if (q == std::string::npos) q = a.prompt_ids.size();
      try {
        ids.push_back(int32_t(std::stol(a.prompt_ids.substr(p, q - p))));
      } catch (const std::exception&) {
        fail(Errc::usage, "", "--prompt-ids", "'" + a.prompt_ids.substr(p, q - p) + "' is not a token id");
      }
      p = q + 1;
    }
  }
  if (ids.empty()) fail(Errc::input, "", "--prompt", "the prompt has no tokens (and the tokenizer no BOS)");
  // The next-token logits of the chosen engine: the CPU reference (model/generate.h) or the GPU
  // decode (eval/decode_cuda.h), both fed the prompt once, then one token per step.
  std::function<VecF(const std::vector<int32_t>&)> feed;
  std::function<int()> position;
  // Greedy on the GPU: the device picks each token and feeds it at once (DecodeCuda::next_greedy);
  // only the token crosses to the host, and the next step runs while the host prints this one.
  std::function<int32_t(bool then_feed)> next_on_device;
  std::unique_ptr<Generator> cpu;
#ifdef PTQKIT_HAVE_CUDA
  std::unique_ptr<cuda::DecodeCuda> gpu;
#endif
  if (a.device == "cuda") {
#ifndef PTQKIT_HAVE_CUDA
    fail(Errc::usage, "", "--device", "this build has no CUDA");
#else
    if (!cuda::available()) fail(Errc::usage, "", "--device", "cuda requested, but " + cuda::describe());
    cuda::GpuLogits gl(*model, a.model);
    const int max_len = std::min(c.max_position_embeddings, int(ids.size()) + std::max(a.max_tokens, 1));
    gpu = std::make_unique<cuda::DecodeCuda>(gl.decode_weights(), 1, max_len);
    feed = [&](const std::vector<int32_t>& t) {
      gpu->feed(t, int(t.size()));
      return VecF(gpu->logits().row(0).transpose());
    };
    position = [&] { return gpu->position(); };
    if (a.temperature <= 0) next_on_device = [&](bool then_feed) { return gpu->next_greedy(then_feed)[0]; };
#endif
  } else {
    cpu = std::make_unique<Generator>(*model);
    feed = [&](const std::vector<int32_t>& t) { return cpu->feed(t); };
    position = [&] { return cpu->position(); };
  }
  const double load_s = seconds_since(t_load);
  const std::vector<int32_t> eos = a.ignore_eos ? std::vector<int32_t>{} : eos_ids(c);
  Rng rng(a.seed, 0x67656e);
  const Sampling s{a.temperature, a.top_p};

  std::fputs(tok ? a.prompt.c_str() : a.prompt_ids.c_str(), stdout);
  std::fflush(stdout);
  const auto t_prefill = std::chrono::steady_clock::now();
  VecF logits = feed(ids);
  const double prefill_s = seconds_since(t_prefill);
  std::vector<int32_t> out;
  // The continuation's text: decode(prompt's last token + out) past decode(that token). Decoded
  // alone, the first new token would lose its leading space (SentencePiece drops a sequence's
  // leading "▁": "Once" + "▁upon" printed "Onceupon"). Where the context's text is not a prefix of
  // the whole (a UTF-8 character split across the boundary), the tokens are decoded alone.
  const std::vector<int32_t> context(ids.end() - 1, ids.end());
  const std::string context_text = tok ? tok->decode(context) : "";
  auto continuation = [&] {
    std::vector<int32_t> all = context;
    all.insert(all.end(), out.begin(), out.end());
    const std::string whole = tok->decode(all);
    return whole.compare(0, context_text.size(), context_text) == 0 ? whole.substr(context_text.size()) : tok->decode(out);
  };
  std::string shown;   // the decoded text so far: each step prints what it added (SentencePiece joins pieces)
  const auto t_decode = std::chrono::steady_clock::now();
  std::string stop = "max_tokens";
  for (int i = 0; i < a.max_tokens; ++i) {
    // Whether a token follows this one: decided before it is chosen, so the device path can feed
    // it at once (a step past an end-of-sequence token is launched and left unused).
    const bool last = i + 1 == a.max_tokens, full = position() >= c.max_position_embeddings;
    const int32_t t = next_on_device ? next_on_device(!last && !full) : sample_token(logits, s, rng);
    if (std::find(eos.begin(), eos.end(), t) != eos.end()) { stop = "eos"; break; }
    out.push_back(t);
    const std::string text = tok ? continuation() : shown + "," + std::to_string(t);
    if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) std::fputs(text.c_str() + shown.size(), stdout);
    shown = text;
    std::fflush(stdout);
    if (last) break;
    if (full) { stop = "context"; break; }
    if (!next_on_device) logits = feed({t});
  }
  const double decode_s = seconds_since(t_decode);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double decode_tps = out.size() > 1 ? double(out.size() - 1) / decode_s : 0;
  std::fprintf(stderr, "ptqkit: %zu prompt tokens in %.3f s (%.1f tok/s), %zu generated in %.3f s (%.1f tok/s), stop: %s; load %.2f s\n",
               ids.size(), prefill_s, double(ids.size()) / prefill_s, out.size(), decode_s, decode_tps, stop.c_str(), load_s);
  if (!a.json_out.empty()) {
    nlohmann::json j = {{"model", a.model}, {"format", model_format(a.model)}, {"prompt_tokens", ids}, {"tokens", out},
                        {"text", shown}, {"stop", stop}, {"device", a.device},
                        {"sampling", {{"temperature", a.temperature}, {"top_p", a.top_p}, {"seed", a.seed}}},
                        {"seconds", {{"load", load_s}, {"prefill", prefill_s}, {"decode", decode_s}}}};
    write_file_atomic(a.json_out, j.dump(2) + "\n");
  }
  return 0;
}
}  // namespace

Command add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "generate text from a prompt with any checkpoint ptqkit reads (greedy by default)");
  sub->add_option("--model", a->model, "model folder (float, packed, or GGUF) or .gguf file")->required();
  sub->add_option("--prompt", a->prompt, "the prompt text");
  sub->add_option("--prompt-ids", a->prompt_ids, "the prompt as token ids, comma-separated (output as ids too): checkpoints without a tokenizer");
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate at most")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0: greedy; else sample from softmax(logits / T)")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "nucleus sampling: keep the most likely tokens up to this probability")->capture_default_str();
  sub->add_option("--seed", a->seed, "sampling seed (same seed, same text)")->capture_default_str();
  sub->add_option("--tokenizer", a->tokenizer, "tokenizer file or folder (default: the model folder)");
  sub->add_option("--json", a->json_out, "write the prompt and generated token ids, text and timings here");
  sub->add_option("--device", a->device, "cpu (the reference) or cuda (f16 KV cache; float, gptq (2..8 bits), compressed-tensors and NF4 checkpoints of every family through their kernels; GGUF's blocks, Q4_0 to Q6_K, on the W4A16/W8A16 kernels)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub->add_flag("--ignore-eos", a->ignore_eos, "keep generating past the end-of-sequence token");
  sub->add_flag("--no-bos", a->no_bos, "do not put the BOS token before the prompt");
  return {sub, [a] { return run(*a); }};
}

}  // namespace ptq
