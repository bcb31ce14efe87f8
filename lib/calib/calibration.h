// calibration.h — calibration windows, per ../shared/assets/README.md. Seeded and deterministic;
// what was drawn (file hash, seed, every offset) is returned for the run's report.
//   text file : the whole file encoded as one string with one BOS in front; N windows of L tokens
//               at uniformly random start offsets.
//   .jsonl    : as GPTQ does for C4: a random record whose encoding (BOS + text) is longer than L,
//               then a random window of L tokens inside it.
//   "random"  : BOS then uniformly random token ids (for synthetic models without text).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace ptq {

struct CalibSpec {
  std::string dataset = "random";
  int samples = 128;
  int seq_len = 2048;
  uint64_t seed = 0;
};

struct CalibData {
  std::vector<int32_t> tokens;   // [samples, seq_len], row-major
  int samples = 0, seq_len = 0;
  std::vector<int64_t> offsets;  // start of each window (in the token stream, or in its record)
  std::vector<int64_t> records;  // .jsonl only: the record each window came from
  std::string sha256;            // of the source file
  nlohmann::json describe(const CalibSpec& spec) const;
};

// `tok` may be null for "random". Errors: Errc::input when the text is shorter than one window.
CalibData load_calibration(const CalibSpec& spec, const Tokenizer* tok, int vocab_size, int bos_id);

}  // namespace ptq
