// weights.h — where a model's tensors come from. LlamaModel reads every tensor through this
// interface, by its Hugging Face name and logical shape ([out, in] for a Linear's ".weight"):
// a float safetensors checkpoint here; packed formats (lib/formats) dequantize behind it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/linear_types.h"

namespace ptq {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Shape shape(const std::string& name) const = 0;             // Errc::format naming it if missing
  virtual void read_f32(const std::string& name, float* out) const = 0; // numel(shape) floats, row-major
  virtual std::string file_of(const std::string& name) const = 0;     // for error messages
  virtual void release(const std::string& name) const {}              // done with it: drop cached pages
  // Rows `rows` of a 2-D tensor (the embedding gather). Default: read all, copy the rows.
  virtual void read_rows_f32(const std::string& name, const std::vector<int32_t>& rows, float* out) const;
  virtual const Checkpoint* checkpoint() const { return nullptr; }    // the float checkpoint, if that is what this is
  // W8A8: how a Linear's (module name, no ".weight") input is quantized, and its int8 weights.
  virtual ActQuant act_quant(const std::string& module) const { return {}; }
  virtual bool read_int8(const std::string& module, MatI* q, VecF* scale) const { return false; }
};

// Rows `rows` of the float (f32/f16/bf16) 2-D tensor n of ck, converted to fp32 row by row (no
// copy of the whole tensor): the embedding gather of every forward chunk.
void read_rows_f32(const Checkpoint& ck, const std::string& n, const std::vector<int32_t>& rows, float* out);
// Errc::input naming file and tensor n unless every row index lies in [0, count).
void check_rows(const std::vector<int32_t>& rows, int64_t count, const std::string& file, const std::string& n);

// A float (f32/f16/bf16) safetensors checkpoint.
class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::string& path) : ck_(path) {}
  bool has(const std::string& n) const override { return ck_.has(n); }
  Shape shape(const std::string& n) const override { return ck_.get(n).shape; }
  void read_f32(const std::string& n, float* out) const override;
  std::string file_of(const std::string& n) const override { return ck_.file_of(n); }
  void release(const std::string& n) const override { ck_.release(n); }
  void read_rows_f32(const std::string& name, const std::vector<int32_t>& rows, float* out) const override;
  const Checkpoint* checkpoint() const override { return &ck_; }
 private:
  Checkpoint ck_;
};

}  // namespace ptq
