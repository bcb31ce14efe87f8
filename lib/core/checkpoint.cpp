#include "core/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/pytorch_bin.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptq {

std::string model_subfolders_hint(const std::string& dir) {
  std::vector<std::string> models;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && fs::exists(e.path() / "config.json", ec)) models.push_back(e.path().filename().string() + "/");
  std::sort(models.begin(), models.end());
  std::string hint;
  for (const std::string& m : models) hint += (hint.empty() ? "; its subfolders " : ", ") + m;
  return hint.empty() ? hint : hint + " hold models (a run's formats): give one of them";
}

std::unique_ptr<TensorFile> open_tensor_file(const std::string& path) {
  if (looks_like_pytorch_bin(path)) return std::make_unique<PytorchBinFile>(path);
  return std::make_unique<SafetensorsFile>(path);
}

// An index file ({"weight_map": {tensor: shard file}}) and the shards it names, each opened once.
void Checkpoint::open_index(const std::string& index) {
  json j;
  try { j = json::parse(read_text_file(index)); } catch (const json::exception& e) {
    fail(Errc::format, index, "", std::string("malformed JSON: ") + e.what());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail(Errc::format, index, "weight_map", "missing or not an object");
  std::map<std::string, const TensorFile*> by_file;
  for (auto& [name, f] : j["weight_map"].items()) {
    if (!f.is_string()) fail(Errc::format, index, "weight_map." + name, "must be a file name");
    const std::string fname = f.get<std::string>();
    if (fname.find('/') != std::string::npos) fail(Errc::format, index, "weight_map." + name, "file name must not contain '/'");
    auto it = by_file.find(fname);
    if (it == by_file.end()) {
      if (!fs::exists(dir_ + "/" + fname)) fail(Errc::io, index, "weight_map." + name, "shard '" + fname + "' does not exist");
      files_.push_back(open_tensor_file(dir_ + "/" + fname));
      it = by_file.emplace(fname, files_.back().get()).first;
    }
    if (!it->second->has(name)) fail(Errc::format, it->second->path(), name, "listed in the index but not in this shard");
    where_[name] = it->second;
  }
}

Checkpoint::Checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    dir_ = fs::path(path).parent_path().string();
    files_.push_back(open_tensor_file(path));
  } else if (fs::is_directory(path, ec)) {
    dir_ = path;
    bool indexed = false;
    for (const char* stem : {"model.safetensors", "pytorch_model.bin"}) {
      if (fs::exists(path + "/" + stem + ".index.json")) {
        open_index(path + "/" + stem + ".index.json");
        indexed = true;
        break;
      }
      if (fs::exists(path + "/" + stem)) {
        files_.push_back(open_tensor_file(path + "/" + stem));
        break;
      }
    }
    if (indexed) return;
    if (files_.empty())
      fail(Errc::io, path, "", "no model.safetensors, model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json in this folder" +
                                   model_subfolders_hint(path));
  } else {
    fail(Errc::io, path, "", "no such file or folder");
  }
  for (auto& f : files_)
    for (auto& n : f->names()) where_[n] = f.get();
}

TensorView Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(Errc::format, dir_, name, "tensor missing from the checkpoint");
  return it->second->get(name);
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(Errc::format, dir_, name, "tensor missing from the checkpoint");
  return it->second->path();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (auto& [n, f] : where_) r.push_back(n);
  return r;
}

void Checkpoint::release(const std::string& name) const {
  auto it = where_.find(name);
  if (it != where_.end()) it->second->release(it->second->get(name));
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> r;
  for (auto& f : files_) r.push_back(f->path());
  return r;
}

size_t Checkpoint::total_bytes() const {
  size_t s = 0;
  for (auto& [n, f] : where_) s += f->get(n).nbytes;
  return s;
}

}  // namespace ptq
