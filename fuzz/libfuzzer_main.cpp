// libfuzzer_main.cpp — the libFuzzer entry point for one target, chosen at compile time
// (-DPTQ_FUZZ_TARGET=safetensors); built by fuzz/CMakeLists.txt with clang, ASan and UBSan.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return ptqfuzz::PTQ_FUZZ_TARGET(data, size); }
