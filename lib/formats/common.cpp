#include "formats/common.h"

#include <algorithm>

#include "formats/compressed_tensors.h"
#include "formats/fake.h"
#include "formats/gguf.h"
#include "formats/gptq.h"
#include "formats/nf4.h"
#include "model/schedule.h"

namespace ptq {

using nlohmann::json;

namespace formats {

bool ends_with(const std::string& s, const std::string& e) { return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0; }
std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - 7); }   // strip ".weight"

namespace {
Tensor copy_of(const Checkpoint& ck, const std::string& name) {
  TensorView t = ck.get(name);
  Tensor out(t.dtype, t.shape);
  std::memcpy(out.bytes.data(), t.data, t.nbytes);
  ck.release(name);
  return out;
}
}  // namespace

QuantizedLinear unpacked_shape(int bits, bool sym, int64_t rows, int64_t cols, int64_t groups) {
  QuantizedLinear q;
  q.spec.bits = bits;
  q.spec.sym = sym;
  q.rows = rows;
  q.cols = cols;
  q.groups = groups;
  return q;
}

std::vector<float> read_floats(const Checkpoint& ck, const std::string& name) { return tensor_to_f32(ck.get(name)); }


// The Linears of the decoder layers with what the store holds for them.
std::vector<ModulePlan> plan(const ExportJob& job) {
  std::vector<ModulePlan> p;
  const auto& c = job.model->config();
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (LinearId pr : layer_schedule(c, l).linears()) {
      const LinearShape sh = linear_shape(c, pr);
      ModulePlan m{linear_name(c, l, pr), sh.out, sh.in, {}, false};
      QuantStore::Info info;
      if (job.store && job.store->info(m.name, &info)) { m.spec = info.spec; m.quantized = true; }
      p.push_back(m);
    }
  return p;
}
std::vector<std::string> float_modules(const LlamaConfig& c) {
  std::vector<std::string> m = {"lm_head"};
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.moe_layer(l)) m.push_back(router_name(c, l));
  return m;
}
int64_t groups_of(const ModulePlan& m) { return m.spec.group_size > 0 ? (m.cols + m.spec.group_size - 1) / m.spec.group_size : 1; }

// Writes every tensor of the source, replacing the ".weight" of each module in `packed` by the
// tensors `make_specs` lists, produced by `produce_packed`; config.json gets quantization_config.
std::vector<std::string> write_model(const ExportJob& job, const std::map<std::string, std::vector<TensorSpec>>& packed,
                                     const TensorProducer& produce_packed, const json& qconfig) {
  const Checkpoint& src = job.model->checkpoint();
  std::vector<TensorSpec> specs;
  std::map<std::string, bool> is_packed;
  for (auto& n : ordered_tensor_names(src)) {
    auto it = ends_with(n, ".weight") ? packed.find(module_of(n)) : packed.end();
    if (it == packed.end()) {
      TensorView t = src.get(n);
      specs.push_back({n, t.dtype, t.shape});
    } else {
      for (auto& s : it->second) { specs.push_back(s); is_packed[s.name] = true; }
    }
  }
  auto produce = [&](const TensorSpec& s) {
    if (is_packed.count(s.name)) return produce_packed(s);
    VecF v;
    if (job.store && job.store->float_override(s.name, &v)) return tensor_from_f32(v.data(), s.shape, s.dtype);   // smoothed norms, the float Linears they feed
    return copy_of(src, s.name);
  };
  std::vector<std::string> files = write_checkpoint_tensors(job.out_dir, specs, produce, job.max_shard_bytes);
  for (auto& f : copy_side_files(job.model->dir(), job.out_dir)) files.push_back(f);
  json cfg = job.model->config().raw;
  cfg["quantization_config"] = qconfig;
  write_file_atomic(job.out_dir + "/config.json", cfg.dump(2) + "\n");
  return files;
}

}  // namespace formats

void check_format(const std::string& fmt, const LlamaConfig& c, const std::vector<ModulePlan>& plan, int nf4_blocksize) {
  if (fmt == "fake") return;
  if (fmt == "nf4") return check_nf4(plan, nf4_blocksize);
  auto refuse = [&](const std::string& where, const std::string& why) { fail(Errc::usage, "", where, fmt + ": " + why); };
  const ModulePlan* first = nullptr;
  for (auto& m : plan)
    if (m.quantized) { first = &m; break; }
  if (!first && fmt != "gguf" && !plan.empty()) refuse("export.format", "no quantized modules to write");
  for (auto& m : plan) {
    if (!m.quantized) {
      if (fmt == "gptq" || fmt == "gptq_v2")
        refuse(m.name, "every Linear of the decoder layers must be quantized; this one is left in float (see quantization.ignore)");
      continue;
    }
    const QuantSpec& a = first->spec;
    const QuantSpec& b = m.spec;
    if (fmt != "gguf" && b.form != GridForm::integer_zero)
      refuse(m.name, std::string("holds GPTQ's integer-zero grids; this module is solved on llama.cpp's ") + grid_form_name(b.form) +
                         " grid (gguf_type), which only gguf (and fake) write");
    if (fmt != "gguf" && (b.bits != a.bits || b.group_size != a.group_size || b.sym != a.sym || b.act_order != a.act_order ||
                          b.static_groups != a.static_groups))
      refuse(m.name, "one quantization setting for the whole model is written; this module's differs from " + first->name +
                         "'s (per-module overrides export as fake or gguf)");
    if (fmt == "gptq" || fmt == "gptq_v2") check_gptq_module(m, fmt == "gptq_v2");
    else if (fmt == "compressed-tensors") check_ct_module(m);
    else if (fmt == "gguf") check_gguf_module(m);
  }
  if (fmt == "gguf") check_gguf_model(c);
}

}  // namespace ptq
