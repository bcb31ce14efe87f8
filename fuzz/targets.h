// targets.h — fuzz targets: each takes arbitrary bytes, hands them to one of ptqkit's readers as a
// file (or a model folder), and exercises what it parsed. A ptq::Error (a clear message naming the
// file and field) is the expected outcome for bad input; any other exception, a crash, a sanitizer
// report, a hang or an allocation beyond libFuzzer's limit is a bug.
//
// Built twice: into libFuzzer binaries with clang, ASan and UBSan (scripts/fuzz.sh), and into the
// regular test build, where tests/test_fuzz.cpp replays the seed corpora and every crash input
// found so far (fuzz/regressions/<target>/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ptqfuzz {

using Target = int (*)(const uint8_t* data, size_t size);
struct NamedTarget { const char* name; Target fn; };

int safetensors(const uint8_t* data, size_t size);   // a .safetensors file
int config(const uint8_t* data, size_t size);        // config.json
int recipe(const uint8_t* data, size_t size);        // a YAML recipe
int tokenizer_json(const uint8_t* data, size_t size);   // tokenizer.json (byte-level BPE)
int sentencepiece(const uint8_t* data, size_t size);    // tokenizer.model
int gguf(const uint8_t* data, size_t size);          // a .gguf file
int pytorch_bin(const uint8_t* data, size_t size);   // a torch.save checkpoint (zip or legacy pickle)
// A packed checkpoint folder: config.json (with quantization_config), then the separator line
// "\n--safetensors--\n", then model.safetensors; opened with open_model and one layer read.
int packed(const uint8_t* data, size_t size);

const std::vector<NamedTarget>& all_targets();

}  // namespace ptqfuzz
