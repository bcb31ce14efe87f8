#include "targets.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/pytorch_bin.h"
#include "core/safetensors.h"
#include "formats/gguf.h"
#include "formats/open.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "pipeline/recipe.h"

namespace ptqfuzz {

namespace fs = std::filesystem;

namespace {
// One scratch folder per process, in memory when /dev/shm exists.
const std::string& scratch() {
  // Never destroyed: the atexit cleanup runs after static destructors would have.
  static const std::string* dir = [] {
    std::string base = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
    auto* d = new std::string(base + "/ptqkit-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(*d);
    std::atexit([] { std::error_code ec; fs::remove_all(scratch(), ec); });
    return d;
  }();
  return *dir;
}
std::string put(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}
// Runs `body`; a ptq::Error is the expected answer to bad input.
template <class F>
int guarded(F&& body) {
  try {
    body();
  } catch (const ptq::Error&) {
  }
  return 0;
}
}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  return guarded([&] {
    ptq::SafetensorsFile f(put("fuzz.safetensors", data, size));
    for (auto& n : f.names()) {
      ptq::TensorView t = f.get(n);
      if (t.numel() <= (1 << 20) && (t.dtype == ptq::DType::F32 || ptq::dtype_is_float16(t.dtype))) {
        (void)ptq::tensor_to_f32(t);
      }
    }
  });
}

int config(const uint8_t* data, size_t size) {
  return guarded([&] {
    fs::create_directories(scratch() + "/cfg");
    put("cfg/config.json", data, size);
    ptq::LlamaConfig c = ptq::load_config(scratch() + "/cfg");
    (void)c.params_per_layer();
  });
}

int recipe(const uint8_t* data, size_t size) {
  return guarded([&] {
    ptq::Recipe r = ptq::load_recipe(put("fuzz.yaml", data, size));
    (void)r.to_yaml();
    (void)r.spec_for("model.layers.0.self_attn.q_proj");
  });
}

namespace {
void exercise(const ptq::Tokenizer& t) {
  const std::vector<int32_t> ids = t.encode("Hello world, once upon a time: 123 \xc3\xa9\xe2\x82\xac !?");
  (void)t.decode(ids);
}
}  // namespace

int tokenizer_json(const uint8_t* data, size_t size) {
  return guarded([&] {
    fs::create_directories(scratch() + "/tj");
    put("tj/tokenizer.json", data, size);
    exercise(*ptq::load_tokenizer(scratch() + "/tj", 1));
  });
}

int sentencepiece(const uint8_t* data, size_t size) {
  return guarded([&] {
    fs::create_directories(scratch() + "/sp");
    put("sp/tokenizer.model", data, size);
    exercise(*ptq::load_tokenizer(scratch() + "/sp", 1));
  });
}

int pytorch_bin(const uint8_t* data, size_t size) {
  return guarded([&] {
    ptq::PytorchBinFile f(put("fuzz.bin", data, size));
    double sum = 0;   // touch every byte of every tensor the reader accepted
    for (auto& n : f.names()) {
      const ptq::TensorView t = f.get(n);
      if (t.dtype == ptq::DType::F32 || ptq::dtype_is_float16(t.dtype))
        for (float v : ptq::tensor_to_f32(t)) sum += v;
    }
    (void)sum;
  });
}

int gguf(const uint8_t* data, size_t size) {
  return guarded([&] {
    ptq::GgufFile f(put("fuzz.gguf", data, size));
    size_t sum = 0;
    for (auto& t : f.tensors())
      for (size_t i = 0; i < t.nbytes; i += 4096) sum += t.data[i];   // every tensor's bytes are inside the file
    (void)sum;
    (void)ptq::parse_config(ptq::gguf_config_json(f), f.path());   // the metadata a GGUF model is opened with
  });
}

int packed(const uint8_t* data, size_t size) {
  static const std::string sep = "\n--safetensors--\n";
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t p = all.find(sep);
  if (p == std::string::npos) return 0;
  return guarded([&] {
    const std::string dir = scratch() + "/pk";
    fs::create_directories(dir);
    put("pk/config.json", data, p);
    put("pk/model.safetensors", data + p + sep.size(), size - p - sep.size());
    std::unique_ptr<ptq::LlamaModel> m = ptq::open_model(dir);
    if (m->config().num_hidden_layers > 0) (void)m->load_layer(0);
  });
}

const std::vector<NamedTarget>& all_targets() {
  static const std::vector<NamedTarget> t = {{"safetensors", safetensors}, {"config", config},   {"recipe", recipe}, {"tokenizer_json", tokenizer_json},
                                             {"sentencepiece", sentencepiece}, {"gguf", gguf}, {"packed", packed},
                                             {"pytorch_bin", pytorch_bin}};
  return t;
}

}  // namespace ptqfuzz
