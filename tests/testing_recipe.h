// testing_recipe.h — the message a recipe is refused with ("" where it parses), for the tests of
// what recipes refuse; and a small recipe to run.
#pragma once
#include <string>

#include "core/error.h"
#include "pipeline/recipe.h"

namespace ptqtest {

inline std::string recipe_error(const std::string& yaml) {
  try {
    ptq::parse_recipe(YAML::Load(yaml), "r.yaml");
  } catch (const ptq::Error& e) {
    return e.what();
  }
  return "";
}

// A recipe of `quantization` (a YAML map's body) and a fake export for a shared model, random
// calibration of `samples` windows of `seq_len`, written to `out`.
inline ptq::Recipe fake_recipe(const std::string& model_dir, const std::string& quantization, const std::string& out, int samples, int seq_len) {
  ptq::Recipe r = ptq::parse_recipe(YAML::Load("quantization: {" + quantization + "}\nexport: {format: fake}\n"), "r.yaml");
  r.model = model_dir;
  r.output = out;
  r.calibration = {"random", samples, seq_len, 0};
  return r;
}

}  // namespace ptqtest
