// golden.h — the golden files of the shared assets (golden/golden-NAME.safetensors), written by HF
// transformers: the input ids a model was fed and the fp32 logits it returned.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/llama.h"
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

// KL(the golden float logits ‖ got, a model's logits on the golden ids), the mean over positions, in fp64.
inline double golden_kl(const Golden& g, const ptq::MatF& got) {
  const int V = g.vocab();
  double sum = 0;
  for (int i = 0; i < g.S * g.T; ++i) {
    const float* p = &g.logits[size_t(i) * size_t(V)];
    double mp = -1e300, mq = -1e300, zp = 0, zq = 0;
    for (int v = 0; v < V; ++v) mp = std::max(mp, double(p[v])), mq = std::max(mq, double(got(i, v)));
    for (int v = 0; v < V; ++v) zp += std::exp(p[v] - mp), zq += std::exp(got(i, v) - mq);
    for (int v = 0; v < V; ++v) {
      const double lp = p[v] - mp - std::log(zp), lq = got(i, v) - mq - std::log(zq);
      sum += std::exp(lp) * (lp - lq);
    }
  }
  return sum / (g.S * g.T);
}
// The same for the model in dir (LlamaModel: float and fake-quantized exports).
inline double golden_kl(const std::string& name, const std::string& dir) {
  const Golden g = golden(name);
  return golden_kl(g, ptq::LlamaModel(dir).forward(g.ids, g.S, g.T));
}

}  // namespace ptqtest
