// qstore.h — quantized layers on disk, one safetensors file per decoder layer
// (layers/layer-00012.safetensors): for each module P, P.qcodes (U32 [rows, w]: each row's codes
// packed as one core/bits.h stream of w = packed_words(cols, bits) words; earlier versions wrote
// P.codes, U8 [rows, cols], still read),
// P.scales (F32 [groups, rows]), P.zeros (I32 [groups, rows]), P.g_idx (I32 [cols]), and the
// module's QuantSpec as JSON in the metadata. Exporters read it one layer at a time, so memory
// stays at one layer whatever the model size; a finished layer file is a resume point.
#pragma once
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quant/quantizer.h"

namespace ptq {

class QuantStore {
 public:
  explicit QuantStore(std::string dir) : dir_(std::move(dir)) {}
  // `floats`: tensors that replace the source's (smoothed norm weights, and the float Linears of a
  // smoothed group with its factors folded in), by full name, flattened; `acts`: W8A8 input spec
  // per module.
  void save_layer(int layer, const std::vector<QuantizedLinear>& modules, const std::vector<std::pair<std::string, VecF>>& floats = {},
                  const std::vector<std::pair<std::string, ActQuant>>& acts = {}, const std::string& report = "") const;
  std::string layer_report(int layer) const;   // the report JSON saved with the layer ("" if none)
  bool float_override(const std::string& tensor, VecF* v) const;   // a replaced tensor, by full name
  ActQuant act_quant(const std::string& module) const;
  bool has_layer(int layer) const;
  // Layers 0, 1, ... saved whole (a file with its report) before the first that is not, at most
  // `limit` (by default, however many there are): where an interrupted run stopped.
  int finished_layers(int limit = std::numeric_limits<int>::max()) const;
  // The quantized module, or nullptr if it was left in float. Loads its layer's file on demand
  // (keeping one layer in memory).
  const QuantizedLinear* get(const std::string& module) const;
  std::string layer_file(int layer) const;
  // Shape and spec of a stored module from its layer file's header only (no codes read);
  // false if the module was left in float.
  struct Info { QuantSpec spec; int64_t rows = 0, cols = 0, groups = 0; };
  bool info(const std::string& module, Info* out) const;
 private:
  std::string dir_;
  mutable int cached_layer_ = -1;
  // info(): every module of one layer, read from its file's header once (a MoE layer has hundreds
  // of modules, and each open parses the whole header and report)
  mutable int info_layer_ = -1;
  mutable std::map<std::string, Info> infos_;
  mutable std::map<std::string, QuantizedLinear> cache_;
  mutable std::map<std::string, VecF> floats_;
  mutable std::map<std::string, ActQuant> acts_;
  void load(int layer) const;
};

int layer_of(const std::string& module);   // "model.layers.12.mlp.up_proj" -> 12; -1 if none

}  // namespace ptq
