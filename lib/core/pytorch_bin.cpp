#include "core/pytorch_bin.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "core/error.h"

namespace ptq {

namespace {

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---------------------------------------------------------------------------------------------
// The zip container: the end-of-central-directory record (zip64's when the counts overflow), the
// central directory, and each entry's local header. Only stored (uncompressed, unencrypted)
// entries are accepted; torch.save writes nothing else. CRCs are not checked: each storage's size
// is, against the element count its pickle states.

struct ZipEntry {
  uint64_t offset;   // of the data, from the start of the file
  uint64_t size;
};

std::map<std::string, ZipEntry> read_zip(const uint8_t* d, uint64_t n, const std::string& path) {
  auto bad = [&](const std::string& field, const std::string& msg) { fail(Errc::format, path, field, msg); };
  if (n < 22) bad("zip", "truncated: " + std::to_string(n) + " bytes, shorter than a zip's end record");
  uint64_t eocd = UINT64_MAX;
  for (uint64_t p = n - 22;; --p) {
    if (le(d + p, 4) == 0x06054b50 && p + 22 + le(d + p + 20, 2) == n) { eocd = p; break; }
    if (p == 0 || n - 22 - p >= 65535) break;
  }
  if (eocd == UINT64_MAX) bad("zip", "no end-of-central-directory record: the file is truncated or not a zip");
  uint64_t count = le(d + eocd + 10, 2), cd_size = le(d + eocd + 12, 4), cd_off = le(d + eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
    if (eocd < 20 || le(d + eocd - 20, 4) != 0x07064b50) bad("zip64", "the end record's counts overflow but there is no zip64 locator");
    const uint64_t rec = le(d + eocd - 20 + 8, 8);
    if (n < 56 || rec > n - 56 || le(d + rec, 4) != 0x06064b50) bad("zip64", "the zip64 end record lies outside the file or has a wrong signature");
    count = le(d + rec + 32, 8), cd_size = le(d + rec + 40, 8), cd_off = le(d + rec + 48, 8);
  }
  if (cd_off > n || cd_size > n - cd_off) bad("zip", "the central directory lies outside the file");
  std::map<std::string, ZipEntry> entries;
  uint64_t p = cd_off;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + 46 > cd_off + cd_size || le(d + p, 4) != 0x02014b50) bad("zip", "central directory entry " + std::to_string(i) + " is truncated or has a wrong signature");
    const uint64_t flags = le(d + p + 8, 2), method = le(d + p + 10, 2);
    uint64_t csize = le(d + p + 20, 4), usize = le(d + p + 24, 4), local = le(d + p + 42, 4);
    const uint64_t nlen = le(d + p + 28, 2), elen = le(d + p + 30, 2), clen = le(d + p + 32, 2);
    if (p + 46 + nlen + elen + clen > cd_off + cd_size) bad("zip", "central directory entry " + std::to_string(i) + " runs past the directory");
    const std::string name(reinterpret_cast<const char*>(d + p + 46), nlen);
    // zip64 extra field: the 64-bit values of whichever fields read 0xFFFFFFFF, in this order.
    for (uint64_t e = p + 46 + nlen; e + 4 <= p + 46 + nlen + elen;) {
      const uint64_t id = le(d + e, 2), len = le(d + e + 2, 2);
      if (e + 4 + len > p + 46 + nlen + elen) bad(name, "an extra field runs past its entry");
      if (id == 0x0001) {
        uint64_t q = e + 4;
        for (uint64_t* v : {&usize, &csize, &local})
          if (*v == 0xFFFFFFFF) {
            if (q + 8 > e + 4 + len) bad(name, "the zip64 extra field is too short");
            *v = le(d + q, 8), q += 8;
          }
      }
      e += 4 + len;
    }
    if (flags & 1) bad(name, "encrypted zip entries are not supported");
    if (method != 0) bad(name, "compressed (method " + std::to_string(method) + ") zip entries are not supported: torch.save stores its entries uncompressed");
    if (csize != usize) bad(name, "a stored entry's compressed and uncompressed sizes differ");
    if (n < 30 || local > n - 30 || le(d + local, 4) != 0x04034b50) bad(name, "the local header lies outside the file or has a wrong signature");
    const uint64_t data = local + 30 + le(d + local + 26, 2) + le(d + local + 28, 2);
    if (data > n || usize > n - data) bad(name, "the entry's " + std::to_string(usize) + " bytes run past the end of the file");
    entries[name] = {data, usize};
    p += 46 + nlen + elen + clen;
  }
  return entries;
}

// ---------------------------------------------------------------------------------------------
// The restricted unpickler. Values live in one pool and refer to each other by index, so a cycle
// or a deep nesting built by a hostile pickle costs no recursion.

enum class Kind : uint8_t { none, boolean, integer, bigint, real, str, bytes, tuple, list, dict, global, storage, tensor };
enum class Global : uint8_t { rebuild_tensor_v2, rebuild_parameter, ordered_dict, storage_type };

struct Value {
  Kind kind{Kind::none};
  int64_t i{0};                    // integer, boolean; global: Global; storage: numel
  double f{0};
  std::string s;                   // str, bytes, bigint (little-endian two's complement), storage key
  DType dtype{DType::F32};         // global (storage_type), storage, tensor
  std::vector<uint32_t> items;     // tuple, list; dict: key, value, key, value...; tensor: storage
  int64_t offset{0};               // tensor: storage offset in elements
  Shape shape, stride;             // tensor
};

struct StorageTypeName { const char* name; DType dtype; };
constexpr StorageTypeName kStorages[] = {
    {"FloatStorage", DType::F32}, {"HalfStorage", DType::F16},  {"BFloat16Storage", DType::BF16}, {"DoubleStorage", DType::F64},
    {"LongStorage", DType::I64},  {"IntStorage", DType::I32},   {"ShortStorage", DType::I16},     {"CharStorage", DType::I8},
    {"ByteStorage", DType::U8},   {"BoolStorage", DType::BOOL}};

class Unpickler {
 public:
  Unpickler(const uint8_t* d, uint64_t n, std::string path, std::string where)
      : d_(d), n_(n), path_(std::move(path)), where_(std::move(where)) {}

  // Runs from `pos` to STOP; returns the top value and sets *end past the STOP opcode.
  uint32_t run(uint64_t pos, uint64_t* end);
  const Value& at(uint32_t i) const { return pool_[i]; }
  const std::map<std::string, DType>& storage_types() const { return storage_types_; }

 private:
  [[noreturn]] void bad(const std::string& msg) const { fail(Errc::format, path_, where_, msg); }
  const uint8_t* take(uint64_t k) {
    if (k > n_ - pos_) bad("truncated pickle: " + std::to_string(k) + " bytes wanted at byte " + std::to_string(pos_));
    const uint8_t* p = d_ + pos_;
    pos_ += k;
    return p;
  }
  uint64_t take_le(int k) { return le(take(uint64_t(k)), k); }
  std::string take_line() {
    const uint8_t* p = d_ + pos_;
    const void* nl = std::memchr(p, '\n', std::min<uint64_t>(n_ - pos_, 256));
    if (!nl) bad("a GLOBAL opcode's name is not a line of at most 256 bytes");
    std::string s(reinterpret_cast<const char*>(p), static_cast<const uint8_t*>(nl) - p);
    pos_ += s.size() + 1;
    return s;
  }
  uint32_t make(Value v) {
    if (pool_.size() >= (1u << 26)) bad("more than 2^26 pickle values");
    pool_.push_back(std::move(v));
    return uint32_t(pool_.size() - 1);
  }
  uint32_t make_int(int64_t i, Kind k = Kind::integer) { Value v; v.kind = k; v.i = i; return make(std::move(v)); }
  uint32_t make_str(std::string s, Kind k) { Value v; v.kind = k; v.s = std::move(s); return make(std::move(v)); }
  uint32_t pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) bad("pickle stack underflow at byte " + std::to_string(pos_));
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top() {
    if (stack_.empty()) bad("pickle stack underflow at byte " + std::to_string(pos_));
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) bad("pickle opcode without a MARK at byte " + std::to_string(pos_));
    std::vector<uint32_t> r(stack_.begin() + std::ptrdiff_t(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return r;
  }
  uint32_t global(const std::string& module, const std::string& name);
  uint32_t persistent_load(uint32_t pid);
  uint32_t reduce(uint32_t callable, uint32_t args);
  int64_t int_of(uint32_t i, const char* what) {
    if (pool_[i].kind != Kind::integer) bad(std::string(what) + " is not an integer");
    return pool_[i].i;
  }
  Shape ints_of(uint32_t i, const char* what) {
    if (pool_[i].kind != Kind::tuple) bad(std::string(what) + " is not a tuple");
    Shape r;
    for (uint32_t e : pool_[i].items) r.push_back(int_of(e, what));
    return r;
  }

  const uint8_t* d_;
  uint64_t n_, pos_{0};
  std::string path_, where_;
  std::vector<Value> pool_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::map<std::string, DType> storage_types_;   // every persistent id's key and dtype
};

uint32_t Unpickler::global(const std::string& module, const std::string& name) {
  Value v;
  v.kind = Kind::global;
  if (module == "torch._utils" && name == "_rebuild_tensor_v2") v.i = int64_t(Global::rebuild_tensor_v2);
  else if (module == "torch._utils" && name == "_rebuild_parameter") v.i = int64_t(Global::rebuild_parameter);
  else if (module == "collections" && name == "OrderedDict") v.i = int64_t(Global::ordered_dict);
  else {
    bool found = false;
    if (module == "torch")
      for (auto& s : kStorages)
        if (name == s.name) v.i = int64_t(Global::storage_type), v.dtype = s.dtype, found = true;
    if (!found)
      bad("the pickle names the global '" + module + "." + name + "', which a tensor checkpoint never needs: refused, nothing was run "
          "(only torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter, collections.OrderedDict and torch.*Storage are allowed)");
  }
  return make(std::move(v));
}

// ('storage', storage type, key, location, numel) in zip files; legacy ones add a view (None).
uint32_t Unpickler::persistent_load(uint32_t pid) {
  const Value& t = pool_[pid];
  if (t.kind != Kind::tuple || t.items.size() < 5 || pool_[t.items[0]].kind != Kind::str || pool_[t.items[0]].s != "storage")
    bad("a persistent id is not ('storage', type, key, location, numel)");
  const Value& type = pool_[t.items[1]];
  if (type.kind != Kind::global || type.i != int64_t(Global::storage_type)) bad("a persistent id's storage type is not a torch.*Storage");
  if (pool_[t.items[2]].kind != Kind::str) bad("a persistent id's storage key is not a string");
  if (t.items.size() > 5 && !(t.items.size() == 6 && pool_[t.items[5]].kind == Kind::none))
    bad("storage views (legacy view metadata) are not supported");
  Value s;
  s.kind = Kind::storage;
  s.dtype = type.dtype;
  s.s = pool_[t.items[2]].s;
  s.i = int_of(t.items[4], "a storage's element count");
  auto [it, fresh] = storage_types_.emplace(s.s, s.dtype);
  if (!fresh && it->second != s.dtype) bad("storage '" + s.s + "' is named with two dtypes");
  if (s.i < 0) bad("a storage's element count is negative");
  return make(std::move(s));
}

uint32_t Unpickler::reduce(uint32_t callable, uint32_t args) {
  const Value& c = pool_[callable];
  if (c.kind != Kind::global) bad("REDUCE calls something that is not an allowed global");
  if (pool_[args].kind != Kind::tuple) bad("REDUCE's arguments are not a tuple");
  const std::vector<uint32_t> a = pool_[args].items;
  switch (Global(c.i)) {
    case Global::ordered_dict: {
      if (!a.empty()) bad("collections.OrderedDict called with arguments");
      Value v;
      v.kind = Kind::dict;
      return make(std::move(v));
    }
    case Global::rebuild_parameter:
      if (a.size() != 3 || pool_[a[0]].kind != Kind::tensor) bad("torch._utils._rebuild_parameter's first argument is not a tensor");
      return a[0];
    case Global::rebuild_tensor_v2: {
      if (a.size() < 6 || a.size() > 7) bad("torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, not " + std::to_string(a.size()));
      if (pool_[a[0]].kind != Kind::storage) bad("torch._utils._rebuild_tensor_v2's first argument is not a storage");
      Value t;
      t.kind = Kind::tensor;
      t.items = {a[0]};
      t.dtype = pool_[a[0]].dtype;
      t.offset = int_of(a[1], "a tensor's storage offset");
      t.shape = ints_of(a[2], "a tensor's size");
      t.stride = ints_of(a[3], "a tensor's stride");
      if (t.shape.size() != t.stride.size()) bad("a tensor's size and stride have different lengths");
      return make(std::move(t));
    }
    case Global::storage_type: break;
  }
  bad("REDUCE calls a storage type");
}

uint32_t Unpickler::run(uint64_t pos, uint64_t* end) {
  pos_ = pos;
  stack_.clear(), marks_.clear(), memo_.clear();
  for (;;) {
    const uint64_t at = pos_;
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80: take(1); break;                                  // PROTO
      case 0x95: take(8); break;                                  // FRAME
      case '(': marks_.push_back(stack_.size()); break;           // MARK
      case '.': {                                                 // STOP
        const uint32_t v = pop();
        *end = pos_;
        return v;
      }
      case '0': pop(); break;                                     // POP
      case '1': pop_mark(); break;                                // POP_MARK
      case 'N': stack_.push_back(make(Value{})); break;           // NONE
      case 0x88: stack_.push_back(make_int(1, Kind::boolean)); break;   // NEWTRUE
      case 0x89: stack_.push_back(make_int(0, Kind::boolean)); break;   // NEWFALSE
      case 'K': stack_.push_back(make_int(int64_t(take_le(1)))); break; // BININT1
      case 'M': stack_.push_back(make_int(int64_t(take_le(2)))); break; // BININT2
      case 'J': stack_.push_back(make_int(int64_t(int32_t(uint32_t(take_le(4)))))); break;   // BININT
      case 0x8a: {                                                // LONG1
        const uint64_t k = take_le(1);
        const uint8_t* p = take(k);
        if (k <= 8) {
          uint64_t v = k ? le(p, int(k)) : 0;
          if (k && k < 8 && (p[k - 1] & 0x80)) v |= ~uint64_t(0) << (8 * k);   // sign-extend
          stack_.push_back(make_int(int64_t(v)));
        } else {
          stack_.push_back(make_str(std::string(reinterpret_cast<const char*>(p), k), Kind::bigint));
        }
        break;
      }
      case 'G': {                                                 // BINFLOAT (big-endian)
        const uint8_t* p = take(8);
        uint64_t b = 0;
        for (int i = 0; i < 8; ++i) b = (b << 8) | p[i];
        Value v;
        v.kind = Kind::real;
        std::memcpy(&v.f, &b, 8);
        stack_.push_back(make(std::move(v)));
        break;
      }
      case 'X': case 0x8c: case 0x8d: case 'T': case 'U': case 'B': case 'C': {   // strings and bytes
        const int w = (op == 0x8c || op == 'U' || op == 'C') ? 1 : op == 0x8d ? 8 : 4;
        const uint64_t k = take_le(w);
        const uint8_t* p = take(k);
        stack_.push_back(make_str(std::string(reinterpret_cast<const char*>(p), k), (op == 'B' || op == 'C') ? Kind::bytes : Kind::str));
        break;
      }
      case '}': case ']': case ')': {                             // EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
        Value v;
        v.kind = op == '}' ? Kind::dict : op == ']' ? Kind::list : Kind::tuple;
        stack_.push_back(make(std::move(v)));
        break;
      }
      case 't': case 0x85: case 0x86: case 0x87: {                // TUPLE, TUPLE1-3
        Value v;
        v.kind = Kind::tuple;
        if (op == 't') {
          v.items = pop_mark();
        } else {
          v.items.resize(size_t(op - 0x84));
          for (size_t i = v.items.size(); i-- > 0;) v.items[i] = pop();
        }
        stack_.push_back(make(std::move(v)));
        break;
      }
      case 'q': memo_[take_le(1)] = top(); break;                 // BINPUT
      case 'r': memo_[take_le(4)] = top(); break;                 // LONG_BINPUT
      case 0x94: { const uint64_t k = memo_.size(); memo_[k] = top(); break; }   // MEMOIZE
      case 'h': case 'j': {                                       // BINGET, LONG_BINGET
        auto it = memo_.find(take_le(op == 'h' ? 1 : 4));
        if (it == memo_.end()) bad("a memo entry is read before it is written, at byte " + std::to_string(at));
        stack_.push_back(it->second);
        break;
      }
      case 'c': {                                                 // GLOBAL
        const std::string module = take_line();
        const std::string name = take_line();
        stack_.push_back(global(module, name));
        break;
      }
      case 0x93: {                                                // STACK_GLOBAL
        const uint32_t name = pop(), module = pop();
        if (pool_[name].kind != Kind::str || pool_[module].kind != Kind::str) bad("STACK_GLOBAL's module and name are not strings");
        stack_.push_back(global(pool_[module].s, pool_[name].s));
        break;
      }
      case 'Q': { const uint32_t pid = pop(); stack_.push_back(persistent_load(pid)); break; }   // BINPERSID
      case 'R': {                                                 // REDUCE
        const uint32_t args = pop(), callable = pop();
        stack_.push_back(reduce(callable, args));
        break;
      }
      case 'b': {                                                 // BUILD: only a dict's attribute state, dropped
        pop();
        if (pool_[top()].kind != Kind::dict) bad("BUILD on something that is not a dict");
        break;
      }
      case 'a': {                                                 // APPEND
        const uint32_t v = pop();
        if (pool_[top()].kind != Kind::list) bad("APPEND to something that is not a list");
        pool_[top()].items.push_back(v);
        break;
      }
      case 'e': {                                                 // APPENDS
        const std::vector<uint32_t> vs = pop_mark();
        if (pool_[top()].kind != Kind::list) bad("APPENDS to something that is not a list");
        auto& l = pool_[top()].items;
        l.insert(l.end(), vs.begin(), vs.end());
        break;
      }
      case 's': case 'u': {                                       // SETITEM, SETITEMS
        std::vector<uint32_t> kv;
        if (op == 's') {
          const uint32_t v = pop(), k = pop();
          kv = {k, v};
        } else {
          kv = pop_mark();
          if (kv.size() % 2) bad("SETITEMS with an odd number of items");
        }
        if (pool_[top()].kind != Kind::dict) bad("SETITEM on something that is not a dict");
        auto& dct = pool_[top()].items;
        dct.insert(dct.end(), kv.begin(), kv.end());
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        bad(std::string("unsupported pickle opcode ") + hex + " at byte " + std::to_string(at) + " (torch.save never writes it)");
      }
    }
  }
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* r) { return !__builtin_mul_overflow(a, b, r); }

}  // namespace

bool looks_like_pytorch_bin(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char m[4] = {};
  f.read(m, 4);
  if (f.gcount() < 2) return false;
  return (f.gcount() == 4 && std::memcmp(m, "PK\x03\x04", 4) == 0) || (uint8_t(m[0]) == 0x80 && uint8_t(m[1]) == 0x02);
}

PytorchBinFile::PytorchBinFile(const std::string& path) : map_(path) {
  const uint8_t* d = map_.data();
  const uint64_t n = map_.size();
  // The storages by key: where their bytes are and how many there are.
  std::map<std::string, ZipEntry> storage_bytes;
  uint32_t root = 0;
  std::optional<Unpickler> up;
  legacy_ = !(n >= 4 && std::memcmp(d, "PK\x03\x04", 4) == 0);
  if (!legacy_) {
    const auto entries = read_zip(d, n, path);
    std::string prefix;
    for (auto& [name, e] : entries)
      if (name.size() >= 8 && name.compare(name.size() - 8, 8, "data.pkl") == 0 && (name.size() == 8 || name[name.size() - 9] == '/')) {
        if (!prefix.empty() || name.find('/') != name.rfind('/')) fail(Errc::format, path, name, "more than one data.pkl, or one nested deeper than <archive>/data.pkl");
        prefix = name.substr(0, name.size() - 8);
        if (prefix.empty()) fail(Errc::format, path, name, "data.pkl is not inside an archive folder");
      }
    if (prefix.empty()) fail(Errc::format, path, "data.pkl", "the zip holds no <archive>/data.pkl: not a torch.save checkpoint");
    auto bo = entries.find(prefix + "byteorder");
    if (bo != entries.end() && std::string(reinterpret_cast<const char*>(d + bo->second.offset), bo->second.size) != "little")
      fail(Errc::format, path, prefix + "byteorder", "only little-endian checkpoints are supported");
    for (auto& [name, e] : entries)
      if (name.rfind(prefix + "data/", 0) == 0) storage_bytes[name.substr(prefix.size() + 5)] = e;
    const ZipEntry pkl = entries.at(prefix + "data.pkl");
    up.emplace(d + pkl.offset, pkl.size, path, prefix + "data.pkl");
    uint64_t end = 0;
    root = up->run(0, &end);
  } else {
    // Legacy: magic number, protocol version, system info, the state dict, the storage keys.
    uint64_t pos = 0;
    up.emplace(d, n, path, "legacy pickle");
    const uint32_t magic = up->run(pos, &pos);
    static const std::string kMagic("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);   // 0x1950a86a20f9469cfc6c, little-endian
    if (up->at(magic).kind != Kind::bigint || up->at(magic).s != kMagic)
      fail(Errc::format, path, "magic", "not a torch.save file: it is neither a zip nor starts with torch's legacy magic number");
    const uint32_t version = up->run(pos, &pos);
    if (up->at(version).kind != Kind::integer || up->at(version).i != 1001)
      fail(Errc::format, path, "protocol_version", "legacy protocol version is not 1001");
    up->run(pos, &pos);   // system info: a dict of plain values
    root = up->run(pos, &pos);
    const uint32_t keys = up->run(pos, &pos);
    if (up->at(keys).kind != Kind::list) fail(Errc::format, path, "storage keys", "the list of storage keys is not a list");
    for (uint32_t k : up->at(keys).items) {
      if (up->at(k).kind != Kind::str) fail(Errc::format, path, "storage keys", "a storage key is not a string");
      const std::string& key = up->at(k).s;
      if (pos > n || n - pos < 8) fail(Errc::format, path, "storage " + key, "truncated: the storage's element count is missing");
      const uint64_t numel = le(d + pos, 8);
      pos += 8;
      auto type = up->storage_types().find(key);
      if (type == up->storage_types().end()) fail(Errc::format, path, "storage " + key, "listed, but no tensor of the state dict uses it");
      const size_t es = dtype_size(type->second);
      uint64_t bytes = 0;
      if (!checked_mul(numel, es, &bytes) || bytes > n - pos)
        fail(Errc::format, path, "storage " + key, "its " + std::to_string(numel) + " elements run past the end of the file");
      storage_bytes[key] = {pos, bytes};
      pos += bytes;
    }
  }
  const Value& r = up->at(root);
  if (r.kind != Kind::dict) fail(Errc::format, path, "state dict", "the pickled object is not a dict of tensors");
  for (size_t j = 0; j + 1 < r.items.size(); j += 2) {
    const Value& key = up->at(r.items[j]);
    if (key.kind != Kind::str) fail(Errc::format, path, "state dict", "a key is not a string");
    const std::string& name = key.s;
    const Value& t = up->at(r.items[j + 1]);
    if (t.kind != Kind::tensor) fail(Errc::format, path, name, "not a tensor (a state dict of tensors is expected)");
    const Value& st = up->at(t.items[0]);
    auto sb = storage_bytes.find(st.s);
    if (sb == storage_bytes.end()) fail(Errc::format, path, name, "its storage '" + st.s + "' is not in the file");
    const size_t es = dtype_size(st.dtype);
    uint64_t want = 0;
    if (!checked_mul(uint64_t(st.i), es, &want) || want != sb->second.size)
      fail(Errc::format, path, name, "storage '" + st.s + "' holds " + std::to_string(sb->second.size) + " bytes, but its pickle says " +
                                         std::to_string(st.i) + " elements of " + std::to_string(es) + " bytes");
    // Extent: offset + sum((size-1) * stride) must stay inside the storage.
    uint64_t count = 1, last = uint64_t(t.offset), tmp = 0;
    bool ok = t.offset >= 0, row_major = true;
    int64_t expect = 1;
    for (size_t k = t.shape.size(); k-- > 0;) {
      const int64_t sz = t.shape[k], sd = t.stride[k];
      ok = ok && sz >= 0 && sd >= 0 && checked_mul(count, uint64_t(sz), &count);
      if (!ok) break;
      if (sz > 1 && sd != expect) row_major = false;
      expect *= std::max<int64_t>(sz, 1);
      if (sz > 0) ok = checked_mul(uint64_t(sz - 1), uint64_t(sd), &tmp) && !__builtin_add_overflow(last, tmp, &last);
    }
    if (ok && count > 0) ok = last < uint64_t(st.i);
    if (ok) ok = count <= uint64_t(st.i) || count == 0;
    if (!ok)
      fail(Errc::format, path, name, "size " + shape_str(t.shape) + ", stride " + shape_str(t.stride) + " and offset " + std::to_string(t.offset) +
                                         " reach outside its storage of " + std::to_string(st.i) + " elements");
    if (index_.count(name)) fail(Errc::format, path, name, "appears twice in the state dict");
    TensorView v;
    v.dtype = st.dtype;
    v.shape = t.shape;
    v.nbytes = size_t(count) * es;
    const uint8_t* base = d + sb->second.offset;
    if (count == 0) {
      v.data = base;
    } else if (row_major) {
      v.data = base + size_t(t.offset) * es;
    } else {
      // Gather element by element in row-major order (rare: transformers saves contiguous tensors).
      auto& buf = gathered_.emplace_back(v.nbytes);
      std::vector<int64_t> idx(t.shape.size(), 0);
      for (uint64_t e = 0; e < count; ++e) {
        int64_t src = t.offset;
        for (size_t k = 0; k < idx.size(); ++k) src += idx[k] * t.stride[k];
        std::memcpy(buf.data() + e * es, base + size_t(src) * es, es);
        for (size_t k = idx.size(); k-- > 0;) {
          if (++idx[k] < t.shape[k]) break;
          idx[k] = 0;
        }
      }
      v.data = buf.data();
    }
    index_[name] = v;
    names_.push_back(name);
  }
}

TensorView PytorchBinFile::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(Errc::format, path(), name, "tensor not found");
  return it->second;
}

void PytorchBinFile::release(const TensorView& t) const {
  if (t.data >= map_.data() && t.data + t.nbytes <= map_.data() + map_.size()) map_.release(t.data, t.nbytes);
}

}  // namespace ptq
