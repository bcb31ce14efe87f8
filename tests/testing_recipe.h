// testing_recipe.h — the message a recipe is refused with ("" where it parses), for the tests of
// what recipes refuse.
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

}  // namespace ptqtest
