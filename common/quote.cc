#include "common/quote.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

void AppendEscaped(std::string* out, unsigned char c) {
  switch (c) {
    case '\n':
      out->append("\\n");
      return;
    case '\r':
      out->append("\\r");
      return;
    case '\t':
      out->append("\\t");
      return;
    case '\\':
      out->append("\\\\");
      return;
    default:
      absl::StrAppendFormat(out, "\\x%02x", c);
  }
}

// Bytes of `value` that fit in `max_bytes` without splitting a UTF-8
// character.
size_t CutAt(absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return value.size();
  size_t cut = max_bytes;
  // Back up over continuation bytes (10xxxxxx) to the start of a character.
  while (cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

}  // namespace

std::string Quote(absl::string_view value) {
  const bool cut = value.size() > kMaxQuotedBytes;
  const absl::string_view shown = value.substr(0, cut ? kMaxQuotedBytes : value.size());
  std::string out = "\"";
  for (unsigned char c : shown) {
    if (c == '"') {
      out.append("\\\"");
    } else if (IsControl(c) || c == '\\' || c >= 0x80) {
      AppendEscaped(&out, c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (cut) return absl::StrCat(out, "...\" (", value.size(), " bytes)");
  out.push_back('"');
  return out;
}

std::string EscapeControl(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    if (IsControl(c)) {
      AppendEscaped(&out, c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string Bounded(absl::string_view text, size_t max_bytes) {
  const size_t keep = CutAt(text, max_bytes);
  std::string out = EscapeControl(text.substr(0, keep));
  if (keep < text.size()) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

std::string Truncated(absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return std::string(value);
  const size_t keep = CutAt(value, max_bytes >= 3 ? max_bytes - 3 : 0);
  return absl::StrCat(value.substr(0, keep), "...");
}

}  // namespace ddp
