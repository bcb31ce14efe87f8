// packed_source.cpp — packed.h's WeightSource: finds which format holds each tensor and asks that
// format's reader (gptq.h, compressed_tensors.h, nf4.h) for it.
#include <cstring>

#include "core/json_field.h"
#include "formats/packed.h"

namespace ptq {

using nlohmann::json;
using namespace formats;

namespace {
class PackedSource final : public WeightSource {
 public:
  // JSON of the wrong type anywhere in quantization_config or a quant_state is a format error naming
  // the file (found by fuzzing: nlohmann's type errors used to escape unnamed).
  PackedSource(const std::string& dir, const json& qc) : ck_(dir), qc_(qc) {
    json_errors_named(Errc::format, dir + "/config.json", "", [&] { init(dir, qc); });
  }
  void init(const std::string& dir, const json& qc) {
    method_ = qc.value("quant_method", "");
    if (method_ == "gptq") {
      v2_ = qc.value("checkpoint_format", "gptq") == "gptq_v2";
      bits_ = qc.value("bits", 4);
      sym_ = qc.value("sym", true);
      group_ = qc.value("group_size", 128);
    } else if (method_ == "compressed-tensors") {
      const std::string fmt = qc.value("format", "");
      if (fmt != "pack-quantized" && fmt != "int-quantized")
        fail(Errc::format, dir + "/config.json", "quantization_config.format", "compressed-tensors format '" + fmt + "' is not read (pack-quantized and int-quantized are)");
      const CtWeights w = ct_weights(qc, dir + "/config.json");
      const json& g = *w.config_group;
      if (g.contains("input_activations") && g["input_activations"].is_object()) {
        const json& a = g["input_activations"];
        act_.mode = a.value("strategy", "") == "token" && a.value("dynamic", false) ? ActQuant::per_token
                    : a.value("strategy", "") == "tensor" && !a.value("dynamic", true) ? ActQuant::per_tensor
                    : ActQuant::none;
        if (act_.mode == ActQuant::none) fail(Errc::format, dir + "/config.json", "quantization_config.input_activations", "only int8 per-token dynamic or per-tensor static activations are read");
      }
      bits_ = w.bits;
      sym_ = w.sym;
      group_ = w.group_size;
    } else if (method_ != "bitsandbytes") {
      fail(Errc::format, dir + "/config.json", "quantization_config.quant_method", "unsupported quant_method '" + method_ + "'");
    }
  }
  enum Kind { Float, Gptq, Ct, Nf4, Int8 };
  Kind kind(const std::string& n) const {
    if (ck_.has(n) && ck_.get(n).dtype == DType::I8 && ends_with(n, ".weight") && ck_.has(module_of(n) + ".weight_scale")) return Int8;
    if (ck_.has(n) && !ck_.has(n + ".quant_state.bitsandbytes__nf4")) return Float;
    if (!ends_with(n, ".weight")) return Float;
    const std::string m = module_of(n);
    if (ck_.has(m + ".qweight")) return Gptq;
    if (ck_.has(m + ".weight_packed")) return Ct;
    if (ck_.has(n + ".quant_state.bitsandbytes__nf4")) return Nf4;
    return Float;
  }
  bool has(const std::string& n) const override { return ck_.has(n) || kind(n) != Float; }
  std::string file_of(const std::string& n) const override {
    switch (kind(n)) {
      case Gptq: return ck_.file_of(module_of(n) + ".qweight");
      case Ct: return ck_.file_of(module_of(n) + ".weight_packed");
      default: return ck_.file_of(n);
    }
  }
  Shape shape(const std::string& n) const override {
    return json_errors_named(Errc::format, file_of(n), "", [&] { return shape_impl(n); });
  }
  void read_f32(const std::string& n, float* out) const override {
    json_errors_named(Errc::format, file_of(n), "", [&] { read_f32_impl(n, out); });
  }
  // Float tensors (the embedding) row by row from the file; quantized ones through read_f32.
  void read_rows_f32(const std::string& n, const std::vector<int32_t>& rows, float* out) const override {
    if (kind(n) == Float) ptq::read_rows_f32(ck_, n, rows, out);
    else WeightSource::read_rows_f32(n, rows, out);
  }
  Shape shape_impl(const std::string& n) const {
    const std::string m = ends_with(n, ".weight") ? module_of(n) : n;
    switch (kind(n)) {
      case Gptq: {
        const GptqDims d = gptq_dims(ck_, m);
        return {d.rows, d.cols};
      }
      case Ct: return ct_weight_shape(ck_, m);
      case Nf4: return nf4_quant_state(ck_, n)["shape"].get<Shape>();
      default: return ck_.get(n).shape;   // float, and Int8 ([out, in] as stored)
    }
  }
  void read_f32_impl(const std::string& n, float* out) const {
    const Kind k = kind(n);
    if (k == Float) {
      TensorView t = ck_.get(n);
      convert_to_f32(t.dtype, t.data, out, size_t(t.numel()));
      return;
    }
    const std::string m = module_of(n);
    const Shape s = shape(n);
    if (k == Int8) {
      MatI q;
      VecF sc;
      read_int8(m, &q, &sc);
      for (int64_t r = 0; r < s[0]; ++r)
        for (int64_t c = 0; c < s[1]; ++c) out[r * s[1] + c] = float(q(r, c)) * sc[r];
      return;
    }
    if (k == Nf4) {
      const Nf4Tensor t = read_nf4(ck_, n, nullptr);
      nf4_dequantize(t, numel(s), out);
      return;
    }
    QuantizedLinear q;
    if (k == Gptq) {
      q = unpack_gptq(read_gptq_packed(ck_, m, bits_), v2_, sym_);
    } else {
      q = unpack_ct(read_ct_packed(ck_, m, s, bits_, group_, sym_), sym_);
    }
    MatF W = q.dequantize();
    std::memcpy(out, W.data(), size_t(W.size()) * 4);
  }
  ActQuant act_quant(const std::string& module) const override {
    if (act_.mode == ActQuant::none || kind(module + ".weight") != Int8) return {};
    ActQuant a = act_;
    if (a.mode == ActQuant::per_tensor) a.static_scale = read_floats(ck_, module + ".input_scale").at(0);
    return a;
  }
  bool read_int8(const std::string& m, MatI* q, VecF* scale) const override {
    if (kind(m + ".weight") != Int8) return false;
    TensorView t = ck_.get(m + ".weight");
    q->resize(t.shape[0], t.shape[1]);
    const int8_t* p = reinterpret_cast<const int8_t*>(t.data);
    for (int64_t i = 0; i < q->size(); ++i) q->data()[i] = p[i];
    auto sc = read_floats(ck_, m + ".weight_scale");
    if (int64_t(sc.size()) != t.shape[0]) fail(Errc::format, ck_.file_of(m + ".weight_scale"), m + ".weight_scale", "expected one scale per output channel");
    *scale = Eigen::Map<VecF>(sc.data(), Eigen::Index(sc.size()));
    return true;
  }
 private:
  ActQuant act_;
  Checkpoint ck_;
  json qc_;
  std::string method_;
  int bits_ = 4, group_ = 128;
  bool sym_ = true, v2_ = false;
};
}  // namespace

std::unique_ptr<WeightSource> packed_source(const std::string& dir, const json& qc) { return std::make_unique<PackedSource>(dir, qc); }

}  // namespace ptq
