// fake.h — the "fake" export: a float checkpoint in the source dtype in which every quantized
// Linear holds its dequantized weight s * (q - z). Any float loader runs it; it is the reference
// that the packed formats must evaluate identically to.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "quant/qstore.h"

namespace ptq {

// A tensor's values in the export (by its full name): a quantized Linear's dequantized weight
// ("<module>.weight"), or a float tensor the run replaced (a smoothed norm, a float Linear or a
// bias with scales folded in); false: copied as the source stores it.
using DequantizedLookup = std::function<bool(const std::string& tensor, MatF* W)>;
DequantizedLookup dequantized_from(const QuantStore& store);

// Writes model*.safetensors into out_dir; returns the files written.
std::vector<std::string> export_fake(const Checkpoint& src, const DequantizedLookup& lookup, const std::string& out_dir, size_t max_shard_bytes);

// Copies config.json, generation_config.json and the tokenizer files of a model folder.
std::vector<std::string> copy_side_files(const std::string& src_dir, const std::string& out_dir);

// Tensor names in checkpoint order: embeddings, layers in numeric order, final norm, lm_head.
std::vector<std::string> ordered_tensor_names(const Checkpoint& ck);

}  // namespace ptq
