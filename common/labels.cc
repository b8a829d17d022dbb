#include "common/labels.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ddp {
namespace {

bool ValueChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

bool ValidKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxLabelKeyBytes || !absl::ascii_isalnum(key[0])) return false;
  for (char c : key) {
    if (!ValueChar(c) && c != '/') return false;
  }
  return true;
}

bool ValidValue(absl::string_view value) {
  if (value.size() > kMaxLabelValueBytes) return false;
  for (char c : value) {
    if (!ValueChar(c)) return false;
  }
  return true;
}

// The text quoted safely and cut short: it may be anything a client sent.
std::string Shown(absl::string_view text) {
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, 70)), "\"");
}

}  // namespace

absl::Status CheckLabels(absl::string_view what, const Labels& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", labels.size(), " labels; the limit is ", kMaxLabels));
  }
  for (const auto& [key, value] : labels) {
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": key ", Shown(key),
          " must be 1 to 63 of letters, digits, '.', '_', '-' and '/', starting with a letter or "
          "digit"));
    }
    if (!ValidValue(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the value of ", key, " (", Shown(value),
                       ") must be at most 63 of letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Labels> ParseLabels(absl::string_view what, absl::string_view text) {
  Labels labels;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", Shown(item), " is not key=value (e.g. zone=a,gpu=h200)"));
    }
    if (!labels.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", Shown(item.substr(0, eq)), " is given twice"));
    }
  }
  if (absl::Status s = CheckLabels(what, labels); !s.ok()) return s;
  return labels;
}

bool LabelsMatch(const Labels& labels, const Labels& selector) {
  for (const auto& [key, value] : selector) {
    auto it = labels.find(key);
    if (it == labels.end() || it->second != value) return false;
  }
  return true;
}

std::string FormatLabels(const Labels& labels) {
  return absl::StrJoin(labels, ",", absl::PairFormatter("="));
}

}  // namespace ddp
