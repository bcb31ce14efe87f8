#include "calib/calibration.h"

#include <map>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "model/corpus.h"

namespace ptq {

nlohmann::json CalibData::describe(const CalibSpec& spec) const {
  nlohmann::json j = {{"dataset", spec.dataset}, {"samples", samples}, {"seq_len", seq_len}, {"seed", spec.seed}, {"offsets", offsets}};
  if (!sha256.empty()) j["sha256"] = sha256;
  if (!records.empty()) j["records"] = records;
  j["protocol"] = spec.dataset == "random" ? "BOS + uniform random token ids"
                  : records.empty()        ? "whole file encoded with one BOS; windows at uniform random offsets"
                                           : "random record longer than L (BOS + text), random window inside it (GPTQ C4)";
  if (spec.dataset == "random") j["warning"] = "calibrated on random tokens, not text: the quantization is tuned to no real input";
  return j;
}

CalibData load_calibration(const CalibSpec& spec, const Tokenizer* tok, int vocab_size, int bos_id) {
  const int L = spec.seq_len, N = spec.samples;
  if (L < 2) fail(Errc::usage, "", "calibration.seq_len", "must be at least 2");
  if (N < 1) fail(Errc::usage, "", "calibration.samples", "must be at least 1");
  CalibData c;
  c.samples = N;
  c.seq_len = L;
  c.tokens.reserve(size_t(N) * size_t(L));
  Rng rng(spec.seed, 0xca1b);
  if (spec.dataset == "random") {
    const int lo = vocab_size > 3 ? 3 : 0;   // keep clear of <unk>, <s>, </s>
    for (int s = 0; s < N; ++s) {
      c.offsets.push_back(0);
      for (int t = 0; t < L; ++t)
        c.tokens.push_back(t == 0 && bos_id >= 0 ? bos_id : int32_t(lo + int(rng.below(uint64_t(vocab_size - lo)))));
    }
    return c;
  }
  if (!tok) fail(Errc::usage, spec.dataset, "calibration.dataset", "a text dataset needs the model's tokenizer");
  c.sha256 = sha256_file(spec.dataset);
  if (!is_jsonl(spec.dataset)) {
    std::vector<int32_t> ids = encode_corpus(*tok, spec.dataset);
    if (ids.size() < size_t(L))
      fail(Errc::input, spec.dataset, "calibration.seq_len",
           "calibration text is shorter than one window: " + std::to_string(ids.size()) + " tokens < " + std::to_string(L) + " (set calibration.seq_len lower, or give more text)");
    for (int s = 0; s < N; ++s) {
      const int64_t off = int64_t(rng.below(ids.size() - size_t(L) + 1));
      c.offsets.push_back(off);
      c.tokens.insert(c.tokens.end(), ids.begin() + off, ids.begin() + off + L);
    }
    return c;
  }
  // .jsonl: one text per record
  const std::vector<std::string> texts = read_jsonl_texts(spec.dataset);
  if (texts.empty()) fail(Errc::input, spec.dataset, "", "data file is empty");
  std::map<int64_t, std::vector<int32_t>> cache;
  int64_t attempts = 0;
  for (int s = 0; s < N; ++s) {
    for (;;) {
      if (++attempts > int64_t(N) * 1000 + 100000)
        fail(Errc::input, spec.dataset, "calibration.seq_len", "no record is longer than " + std::to_string(L) + " tokens");
      const int64_t i = int64_t(rng.below(texts.size()));
      auto it = cache.find(i);
      if (it == cache.end()) {
        std::vector<int32_t> ids;
        if (bos_id >= 0) ids.push_back(bos_id);
        auto body = tok->encode(texts[size_t(i)]);
        ids.insert(ids.end(), body.begin(), body.end());
        it = cache.emplace(i, std::move(ids)).first;
      }
      const auto& ids = it->second;
      if (ids.size() <= size_t(L)) continue;
      const int64_t off = int64_t(rng.below(ids.size() - size_t(L)));
      c.records.push_back(i);
      c.offsets.push_back(off);
      c.tokens.insert(c.tokens.end(), ids.begin() + off, ids.begin() + off + L);
      break;
    }
  }
  return c;
}

}  // namespace ptq
