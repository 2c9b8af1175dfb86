// SPDX-License-Identifier: MIT
// attn/io/detail/json.hpp: the JSON side of a safetensors header: a nesting-depth scan of the
// raw text before anything parses it, parsing with duplicate keys rejected, and bounded
// excerpts of values for messages.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {
namespace detail {

/// Deepest nesting of arrays and objects a header may have. The format needs 3 (the header
/// object, a tensor's entry, its shape); 8 leaves room. Everything that walks a parsed header
/// recursively (nlohmann's dump(), copies and comparisons, the excerpts below) is then
/// bounded by it (a 200 KB header of 100000 nested arrays would overflow the stack).
inline constexpr std::size_t kMaxHeaderDepth = 8;

/// "[2, 3]" for a shape.
inline std::string shape_text(const std::vector<Index>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

/// True when `text` is valid UTF-8 (JSON strings must be).
inline bool is_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

/// Scans JSON text (not yet validated) for its deepest nesting of '[' and '{', skipping
/// string contents and their escapes. Returns the byte offset where the nesting first
/// exceeds `limit`, or `size` if it never does. One pass, no recursion, no allocation.
inline std::size_t find_nesting_over(const char* text, std::size_t size, std::size_t limit) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < size; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return size;
}

/// The first key an object repeats while parsing: `owner` is the top-level key it sits
/// under ("" for a repeated top-level key).
struct DuplicateKey {
  bool found = false;
  std::string owner, key;
};

/// Parses JSON text (whose nesting find_nesting_over() has bounded) and reports the first
/// repeated key of any object (nlohmann keeps the last silently).
/// @throws nlohmann::json::parse_error for text that is not JSON.
inline nlohmann::json parse_json(const char* text, std::size_t size, DuplicateKey& duplicate) {
  std::vector<std::set<std::string>> keys;  // one set per open object (arrays push too)
  std::string top_key;
  const nlohmann::json::parser_callback_t callback =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start || event == Event::array_start) {
          keys.emplace_back();
        } else if ((event == Event::object_end || event == Event::array_end) && !keys.empty()) {
          keys.pop_back();
        } else if (event == Event::key && !keys.empty()) {
          const std::string& key = parsed.get_ref<const std::string&>();
          if (depth == 1) top_key = key;
          if (!keys.back().insert(key).second && !duplicate.found) {
            duplicate = {true, depth == 1 ? std::string() : top_key, key};
          }
        }
        return true;
      };
  return nlohmann::json::parse(text, text + size, callback);
}

inline void append_excerpt(const nlohmann::json& value, std::string& out, std::size_t budget,
                           std::size_t depth) {
  const auto quoted = [&](const std::string& s) {
    out += nlohmann::json(s.substr(0, budget))
               .dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  };
  if (!value.is_structured()) {
    if (value.is_string()) {
      quoted(value.get_ref<const std::string&>());
    } else {
      out += value.dump();  // a number, bool or null: no recursion
    }
    return;
  }
  const bool object = value.is_object();
  if (depth >= kMaxHeaderDepth) {
    out += object ? "{...}" : "[...]";
    return;
  }
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (out.size() >= budget) break;
    if (!first) out += ',';
    first = false;
    if (object) {
      quoted(it.key());
      out += ':';
    }
    append_excerpt(it.value(), out, budget, depth + 1);
  }
  out += object ? '}' : ']';
}

/// A JSON value as at most ~80 characters of compact text, for messages. Reads at most
/// about 80 characters' worth of the value and recurses at most kMaxHeaderDepth levels,
/// whatever the value's size and depth.
inline std::string json_excerpt(const nlohmann::json& value) {
  constexpr std::size_t kBudget = 80;
  std::string text;
  append_excerpt(value, text, kBudget, 0);
  if (text.size() > kBudget) text = text.substr(0, kBudget - 3) + "...";
  return text;
}

}  // namespace detail
}  // namespace io
ATTN_NAMESPACE_END
