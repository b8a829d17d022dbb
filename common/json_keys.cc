#include "common/json_keys.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace ddp {
namespace {

// An object or array being scanned.
struct Frame {
  bool object = false;
  // Keys seen so far, by their protobuf field spelling, with the spelling
  // the text used.
  std::map<std::string, std::string> keys;
  bool expect_key = false;
  std::string last_key;
};

// The string starting at json[*i] (a '"'), with its escapes decoded;
// advances *i past it. Nothing when it does not end.
std::optional<std::string> ReadString(absl::string_view json, size_t* i) {
  std::string out;
  for (size_t j = *i + 1; j < json.size(); ++j) {
    const char c = json[j];
    if (c == '"') {
      *i = j + 1;
      return out;
    }
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++j >= json.size()) return std::nullopt;
    switch (json[j]) {
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        if (j + 4 >= json.size()) return std::nullopt;
        const std::string hex = absl::AsciiStrToLower(json.substr(j + 1, 4));
        const unsigned long code = std::strtoul(hex.c_str(), nullptr, 16);
        // Field names are ASCII: anything else only has to compare equal
        // to itself.
        if (code > 0 && code < 0x80) {
          out.push_back(static_cast<char>(code));
        } else {
          absl::StrAppend(&out, "\\u", hex);
        }
        j += 4;
        break;
      }
      default:  // '"', '\\', '/'
        out.push_back(json[j]);
    }
  }
  return std::nullopt;
}

// The lowerCamelCase name protobuf's JSON gives a snake_case field name.
std::string FieldSpelling(const std::string& key) {
  std::string out;
  bool upper = false;
  for (char c : key) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? absl::ascii_toupper(c) : c);
    upper = false;
  }
  return out;
}

// "job.optimizer.lr": where the innermost frame's last key is. Built only
// for the error, so deep nesting costs no memory per level.
std::string PathOf(const std::vector<Frame>& stack) {
  std::string path = "job";
  for (const Frame& frame : stack) {
    if (frame.object) {
      absl::StrAppend(&path, ".", EscapeControl(Truncated(frame.last_key, kMaxQuotedBytes)));
    } else {
      path.append("[]");
    }
    if (path.size() > 4 * kMaxQuotedBytes) return Truncated(path, 4 * kMaxQuotedBytes);
  }
  return path;
}

}  // namespace

absl::Status CheckNoDuplicateKeys(absl::string_view json) {
  std::vector<Frame> stack;
  size_t i = 0;
  while (i < json.size()) {
    const char c = json[i];
    if (c == '{' || c == '[') {
      Frame frame;
      frame.object = c == '{';
      frame.expect_key = frame.object;
      stack.push_back(std::move(frame));
      ++i;
    } else if (c == '}' || c == ']') {
      if (stack.empty()) return absl::OkStatus();  // not JSON: the parser says so
      stack.pop_back();
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
      ++i;
    } else if (c == '"') {
      std::optional<std::string> text = ReadString(json, &i);
      if (!text) return absl::OkStatus();
      if (stack.empty() || !stack.back().object || !stack.back().expect_key) continue;
      Frame& frame = stack.back();
      frame.expect_key = false;
      frame.last_key = *text;
      auto [it, added] = frame.keys.emplace(FieldSpelling(*text), *text);
      if (!added) {
        return absl::InvalidArgumentError(absl::StrCat(
            PathOf(stack), ": given twice in one object (as ", Quote(it->second), " and ",
            Quote(*text), "); protobuf's JSON parser would keep only the last, so say it once"));
      }
    } else {
      ++i;  // whitespace, ':', numbers, true, false, null
    }
  }
  return absl::OkStatus();
}

}  // namespace ddp
