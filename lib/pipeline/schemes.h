// schemes.h — named quantization schemes: a recipe in one word (`ptqkit quantize --model DIR
// --scheme W4A16`), as llm-compressor's preset schemes and llama.cpp's type names. Each scheme is
// the quantization and export sections of a recipe; the run writes the effective recipe beside
// its output, so a scheme run is repeatable as a recipe run.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace ptq {

struct Scheme {
  std::string name;          // "W4A16"
  std::string format;        // the deployable format it exports by default
  std::string description;   // one line
  std::string yaml;          // its quantization (and export) sections
  bool calibrated = true;    // false: data-free (NF4)
};
const std::vector<Scheme>& schemes();
// The scheme of that name (case-insensitive); Errc::usage naming the nearest one otherwise.
const Scheme& find_scheme(const std::string& name);

// One line per export format: name and what reads it.
struct FormatInfo {
  std::string name, description;
};
const std::vector<FormatInfo>& export_formats();

// The recipe root of a one-line run: the scheme's sections, then model, output, dataset ("random"
// explicitly, or a text file) and format ("" : the scheme's). A calibrated scheme without a dataset
// is refused, saying how to ask for random tokens.
YAML::Node scheme_recipe(const Scheme& s, const std::string& model, const std::string& output, const std::string& dataset,
                         const std::string& format);

}  // namespace ptq
