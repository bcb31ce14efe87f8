#include "core/env.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ptq {

namespace {
// An integer at s: an optional '-' and digits (no spaces or '+'), in range of long long. Its value,
// and in stop where it ends; false where s does not start one.
bool read_int(const char* s, long long& v, const char*& stop) {
  if (*s != '-' && (*s < '0' || *s > '9')) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoll(s, &end, 10);
  stop = end;
  return end != s && errno != ERANGE;
}
// The comma-separated entries of text, empty ones kept (a list switch refuses them).
std::vector<std::string> entries(const std::string& text) {
  std::vector<std::string> out;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}
}  // namespace

int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  long long v = 0;
  const char* stop = nullptr;
  if (!read_int(e, v, stop) || *stop || v < INT_MIN || v > INT_MAX) fail(Errc::usage, "", name, std::string("'") + e + "': want an integer");
  return int(v);
}

bool env_switch(const char* name, bool dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  if ((*e == '0' || *e == '1') && !e[1]) return *e == '1';
  fail(Errc::usage, "", name, std::string("'") + e + "': want 0 or 1");
}

std::vector<std::vector<int64_t>> env_int_list(const char* name, const char* form, char first, int min_fields, int max_fields) {
  std::vector<std::vector<int64_t>> out;
  const char* e = std::getenv(name);
  if (!e || !*e) return out;
  for (const std::string& entry : entries(e)) {
    std::vector<int64_t> fields;
    bool ok = !entry.empty();
    for (size_t i = 0; ok && i < entry.size();) {
      long long v = 0;
      const char* stop = nullptr;
      ok = read_int(entry.c_str() + i, v, stop);
      const size_t j = ok ? size_t(stop - entry.c_str()) : entry.size();
      fields.push_back(v);
      if (ok && j < entry.size()) ok = entry[j] == (fields.size() == 1 ? first : ':') && j + 1 < entry.size();
      i = j + 1;
    }
    if (!ok || int(fields.size()) < min_fields || int(fields.size()) > max_fields)
      fail(Errc::usage, "", name, "entry '" + entry + "': want " + form + " (integers), entries separated by commas");
    out.push_back(std::move(fields));
  }
  return out;
}

std::vector<int> env_name_list(const char* name, const std::vector<std::string>& choices) {
  std::vector<int> out;
  const char* e = std::getenv(name);
  if (!e || !*e) return out;
  for (const std::string& entry : entries(e)) {
    const auto it = std::find(choices.begin(), choices.end(), entry);
    if (it == choices.end()) {
      std::string all;
      for (const std::string& c : choices) all += (all.empty() ? "" : ", ") + c;
      fail(Errc::usage, "", name, "'" + entry + "': want names among " + all + ", separated by commas");
    }
    out.push_back(int(it - choices.begin()));
  }
  return out;
}

}  // namespace ptq
