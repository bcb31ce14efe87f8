// json_field.h — one optional field of a JSON object, read with its type checked; and the backstop
// that names the file of any JSON error a reader lets through. A field of the
// wrong type is an Error naming the file and the field (nlohmann's own type_error names neither and
// is not an Error: found by fuzzing config.json). A missing or null field gives `def`.
#pragma once
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ptq {

// `where` names the field in the error when `j` is nested (default: `key`).
template <class T>
T json_field(const nlohmann::json& j, const char* key, T def, Errc code, const std::string& file, const std::string& where = "") {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  const nlohmann::json& v = j[key];
  const std::string& name = where.empty() ? std::string(key) : where;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) fail(code, file, name, "must be a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) fail(code, file, name, "must be true or false");
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) fail(code, file, name, "must be an integer");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max())
                               : v.get<int64_t>() < int64_t(std::numeric_limits<T>::min()) || v.get<int64_t>() > int64_t(std::numeric_limits<T>::max()))
      fail(code, file, name, "out of range: " + v.dump());
  } else {
    static_assert(std::is_floating_point_v<T>);
    if (!v.is_number()) fail(code, file, name, "must be a number");
  }
  return v.get<T>();
}

// Runs f(); a JSON error it throws (a type or key error, a parse error) becomes an Error naming the
// file and field: the backstop of readers that walk JSON of outside or damaged origin.
template <class F>
auto json_errors_named(Errc code, const std::string& file, const std::string& field, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    fail(code, file, field, std::string("unexpected JSON structure: ") + e.what());
  }
}

}  // namespace ptq
