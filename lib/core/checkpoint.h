// checkpoint.h — a Hugging Face model folder's tensors, whatever file format holds them.
//
// A TensorFile is one file of named tensors viewed in place (safetensors.h, pytorch_bin.h). A
// Checkpoint is a folder of them: model.safetensors, or shards listed by
// model.safetensors.index.json; failing those, pytorch_model.bin, or shards listed by
// pytorch_model.bin.index.json (safetensors wins where a folder has both, as transformers does).
// The path of a single .safetensors or .bin file is accepted too.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ptq {

class TensorFile {
 public:
  virtual ~TensorFile() = default;
  virtual const std::string& path() const = 0;
  virtual bool has(const std::string& name) const = 0;
  virtual TensorView get(const std::string& name) const = 0;   // Errc::format naming the tensor if missing
  virtual const std::vector<std::string>& names() const = 0;   // in data order
  virtual void release(const TensorView& t) const = 0;         // drop its pages from the resident set
};

// Opens one tensor file by its contents: a torch.save checkpoint, else safetensors.
std::unique_ptr<TensorFile> open_tensor_file(const std::string& path);

// Where `dir` holds no model but its subfolders do (a run of several formats writes each in its
// own: gptq/, fake/, ...): "; its subfolders fake/, gptq/ hold models (...)", else "". For errors.
std::string model_subfolders_hint(const std::string& dir);

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  TensorView get(const std::string& name) const;          // Errc::format naming the tensor if missing
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;                 // sorted
  void release(const std::string& name) const;            // drop its pages from the resident set
  size_t total_bytes() const;
  std::vector<std::string> files() const;                 // the paths of the files it reads, each once
 private:
  void open_index(const std::string& index);
  std::string dir_;
  std::vector<std::unique_ptr<TensorFile>> files_;
  std::map<std::string, const TensorFile*> where_;
};

}  // namespace ptq
