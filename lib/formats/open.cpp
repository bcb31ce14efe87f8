#include "formats/open.h"

#include <filesystem>
#include <map>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/json_field.h"
#include "formats/gguf.h"
#include "formats/packed.h"
#include "model/schedule.h"

namespace fs = std::filesystem;

namespace ptq {

namespace {
// A float checkpoint whose config.json carries "ptqkit_w8a8" (a fake W8A8 export): its Linears
// take int8 activations, evaluated in float (fake-quant).
class FakeW8A8Source final : public WeightSource {
 public:
  FakeW8A8Source(const std::string& dir, const nlohmann::json& spec) : base_(dir) {
    if (!spec.is_object() || !spec.contains("input_scales") || !spec["input_scales"].is_object())
      fail(Errc::format, dir + "/config.json", "ptqkit_w8a8.input_scales", "missing or not an object");
    const bool tok = !spec.contains("strategy") || spec["strategy"] == "token";
    for (auto& [m, sc] : spec["input_scales"].items()) {
      if (!sc.is_number()) fail(Errc::format, dir + "/config.json", "ptqkit_w8a8.input_scales." + m, "not a number");
      acts_[m] = {tok ? ActQuant::per_token : ActQuant::per_tensor, sc.get<float>()};
    }
  }
  bool has(const std::string& n) const override { return base_.has(n); }
  Shape shape(const std::string& n) const override { return base_.shape(n); }
  void read_f32(const std::string& n, float* out) const override { base_.read_f32(n, out); }
  std::string file_of(const std::string& n) const override { return base_.file_of(n); }
  void release(const std::string& n) const override { base_.release(n); }
  void read_rows_f32(const std::string& n, const std::vector<int32_t>& r, float* out) const override { base_.read_rows_f32(n, r, out); }
  ActQuant act_quant(const std::string& m) const override {
    auto it = acts_.find(m);
    return it == acts_.end() ? ActQuant{} : it->second;
  }
 private:
  SafetensorsSource base_;
  std::map<std::string, ActQuant> acts_;
};

}  // namespace

std::string gguf_path(const std::string& path) {
  if (fs::is_regular_file(path) && fs::path(path).extension() == ".gguf") return path;
  if (fs::is_directory(path) && fs::exists(path + "/model.gguf") && !fs::exists(path + "/model.safetensors") &&
      !fs::exists(path + "/model.safetensors.index.json"))
    return path + "/model.gguf";
  return "";
}

std::string model_format(const std::string& path) {
  if (!gguf_path(path).empty()) return "gguf";
  if (!fs::exists(path + "/config.json")) return "float";
  const LlamaConfig c = load_config(path);
  if (c.raw.contains("ptqkit_w8a8")) return "fake-w8a8";
  if (!c.raw.contains("quantization_config")) return "float";
  const auto& q = c.raw["quantization_config"];
  const std::string file = path + "/config.json";
  auto field = [&](const char* k, const char* def) {
    return json_field<std::string>(q, k, def, Errc::config, file, std::string("quantization_config.") + k);
  };
  const std::string m = field("quant_method", "");
  if (m == "gptq") return field("checkpoint_format", "gptq");
  if (m == "bitsandbytes") return "bitsandbytes-nf4";
  if (m == "compressed-tensors") return "compressed-tensors/" + field("format", "?");
  return m;
}

std::unique_ptr<LlamaModel> open_model(const std::string& path) {
  const std::string g = gguf_path(path);
  if (!g.empty()) {
    const std::string dir = fs::path(g).parent_path().string();
    LlamaConfig c = fs::exists(dir + "/config.json") ? load_config(dir) : parse_config(gguf_config_json(GgufFile(g)), g);
    c.raw.erase("quantization_config");
    auto src = gguf_source(g, c);
    return std::make_unique<LlamaModel>(dir.empty() ? "." : dir, c, std::move(src));
  }
  if (fs::is_directory(path) && fs::exists(path + "/config.json")) {
    LlamaConfig c = load_config(path);
    if (c.raw.contains("quantization_config")) {
      auto src = packed_source(path, c.raw["quantization_config"]);
      return std::make_unique<LlamaModel>(path, c, std::move(src));
    }
    if (c.raw.contains("ptqkit_w8a8")) return std::make_unique<LlamaModel>(path, c, std::make_unique<FakeW8A8Source>(path, c.raw["ptqkit_w8a8"]));
  }
  return std::make_unique<LlamaModel>(path);
}

nlohmann::json WeightBits::to_json() const {
  return {{"parameters", linear_weights + other_params}, {"linear_weights", linear_weights}, {"linear_bytes", linear_bytes},
          {"linear_bits_per_weight", linear_bits()}, {"other_parameters", other_params}, {"other_bytes", other_bytes}};
}

WeightBits weight_bits(const std::string& path) {
  const std::string g = gguf_path(path);
  if (!g.empty()) return weight_bits(GgufFile(g));
  return weight_bits(load_config(path), Checkpoint(path));
}

WeightBits weight_bits(const GgufFile& f) {
  WeightBits b;
  for (const auto& t : f.tensors()) {
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    const bool linear = t.name.rfind("blk.", 0) == 0 && t.ne.size() >= 2 && t.name.find("ffn_gate_inp") == std::string::npos;
    (linear ? b.linear_weights : b.other_params) += n;
    (linear ? b.linear_bytes : b.other_bytes) += int64_t(t.nbytes);
  }
  return b;
}

WeightBits weight_bits(const LlamaConfig& c, const Checkpoint& ck) {
  WeightBits b;
  std::map<std::string, int64_t> linear_size;   // "model.layers.3.mlp.down_proj." -> out x in
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId id : layer_schedule(c, l).linears()) {
      const LinearShape sh = linear_shape(c, id);
      linear_size[linear_name(c, l, id) + "."] += sh.out * sh.in;
    }
  std::map<std::string, int64_t> present;
  for (const std::string& n : ck.names()) {
    const TensorView t = ck.get(n);
    std::string owner;
    for (size_t dot = n.find('.'); dot != std::string::npos && owner.empty(); dot = n.find('.', dot + 1))
      if (linear_size.count(n.substr(0, dot + 1)) && n.substr(dot + 1) != "bias") owner = n.substr(0, dot + 1);
    if (owner.empty()) {
      b.other_params += numel(t.shape);
      b.other_bytes += int64_t(t.nbytes);
    } else {
      b.linear_bytes += int64_t(t.nbytes);
      present[owner] = linear_size[owner];
    }
  }
  for (const auto& [name, n] : present) b.linear_weights += n;
  return b;
}

}  // namespace ptq
