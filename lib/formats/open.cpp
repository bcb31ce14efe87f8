#include "formats/open.h"

#include <filesystem>

#include "core/error.h"
#include "core/fsutil.h"
#include "formats/gguf.h"
#include "formats/packed.h"

namespace fs = std::filesystem;

namespace ptq {

namespace {
std::string gguf_path(const std::string& path) {
  if (fs::is_regular_file(path) && fs::path(path).extension() == ".gguf") return path;
  if (fs::is_directory(path) && fs::exists(path + "/model.gguf") && !fs::exists(path + "/model.safetensors") &&
      !fs::exists(path + "/model.safetensors.index.json"))
    return path + "/model.gguf";
  return "";
}
}  // namespace

std::string model_format(const std::string& path) {
  if (!gguf_path(path).empty()) return "gguf";
  if (!fs::exists(path + "/config.json")) return "float";
  const LlamaConfig c = load_config(path);
  if (!c.raw.contains("quantization_config")) return "float";
  const auto& q = c.raw["quantization_config"];
  const std::string m = q.value("quant_method", "");
  if (m == "gptq") return q.value("checkpoint_format", "gptq");
  if (m == "bitsandbytes") return "bitsandbytes-nf4";
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
  }
  return std::make_unique<LlamaModel>(path);
}

}  // namespace ptq
