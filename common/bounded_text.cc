#include "common/bounded_text.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ddp {

std::string Bounded(absl::string_view text, size_t max_bytes) {
  absl::string_view kept = text.substr(0, max_bytes);
  if (kept.size() < text.size()) {
    // Don't end inside a multi-byte character: back off over continuation
    // bytes (10xxxxxx) and the lead byte they belong to.
    size_t end = kept.size();
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    kept = kept.substr(0, end);
  }
  std::string out;
  out.reserve(kept.size());
  for (char c : kept) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      absl::StrAppend(&out, absl::CHexEscape(absl::string_view(&c, 1)));
    } else {
      out.push_back(c);
    }
  }
  if (kept.size() < text.size()) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

}  // namespace ddp
