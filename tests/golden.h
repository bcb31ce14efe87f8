// golden.h — the golden files of the shared assets (golden/golden-NAME.safetensors), written by HF
// transformers: the input ids a model was fed and the fp32 logits it returned.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "testing.h"

namespace ptqtest {

struct Golden {
  std::vector<int32_t> ids;   // [S, T], row-major
  std::vector<float> logits;  // [S * T, vocab]
  int S = 1, T = 0;
  int vocab() const { return int(logits.size() / ids.size()); }
};

// input_ids is [S, T] in the tiny families' files and [T] (one sequence) in the older ones.
inline Golden golden(const std::string& name) {
  ptq::SafetensorsFile g(assets() + "/golden/golden-" + name + ".safetensors");
  const ptq::TensorView v = g.get("input_ids");
  Golden r;
  r.ids.assign(reinterpret_cast<const int32_t*>(v.data), reinterpret_cast<const int32_t*>(v.data) + v.numel());
  r.logits = ptq::tensor_to_f32(g.get("logits"));
  r.S = v.shape.size() == 2 ? int(v.shape[0]) : 1;
  r.T = int(v.shape.back());
  return r;
}

}  // namespace ptqtest
