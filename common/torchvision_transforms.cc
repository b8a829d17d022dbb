#include "common/torchvision_transforms.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace ddp {
namespace {

// A kind the pipeline has: the JSON keys it takes, and those in words.
struct Kind {
  std::set<std::string> keys;
  const char* takes;
};

const Kind* KindNamed(const std::string& name) {
  static const auto* kinds = new std::map<std::string, Kind>{
      {"Resize", {{"kind", "size"}, "size"}},
      {"CenterCrop", {{"kind", "size"}, "size"}},
      {"RandomResizedCrop", {{"kind", "size", "scale", "ratio"}, "size, scale and ratio"}},
      {"RandomHorizontalFlip", {{"kind", "p"}, "p"}},
      {"ToTensor", {{"kind"}, "nothing"}},
      {"Normalize", {{"kind", "mean", "std"}, "mean and std"}},
  };
  auto it = kinds->find(name);
  return it == kinds->end() ? nullptr : &it->second;
}

absl::Status CheckList(const google::protobuf::Value& list, const std::string& field) {
  if (!list.has_list_value()) return absl::OkStatus();
  for (int i = 0; i < list.list_value().values_size(); ++i) {
    const google::protobuf::Value& step = list.list_value().values(i);
    if (!step.has_struct_value()) continue;
    const auto& fields = step.struct_value().fields();
    const std::string at = absl::StrCat(field, "[", i, "]");
    auto kind = fields.find("kind");
    if (kind == fields.end() || !kind->second.has_string_value()) continue;
    const std::string& name = kind->second.string_value();
    const Kind* known = KindNamed(name);
    if (known == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".kind: ", Quote(name), " is not supported (the pipeline has ", kSupportedTransforms,
          "); remove it, or do that augmentation in a program of your own on ddp::DiskDataset"));
    }
    for (const auto& [key, value] : fields) {
      if (known->keys.count(key) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": ", name, " takes no ", Quote(key),
                                                       " (it takes ", known->takes, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTransformsJson(absl::string_view json) {
  google::protobuf::Value root;
  if (!google::protobuf::util::JsonStringToMessage(
           google::protobuf::StringPiece(json.data(), json.size()), &root)
           .ok() ||
      !root.has_struct_value()) {
    return absl::OkStatus();
  }
  auto dataset = root.struct_value().fields().find("dataset");
  if (dataset == root.struct_value().fields().end() || !dataset->second.has_struct_value()) {
    return absl::OkStatus();
  }
  for (const auto& [key, value] : dataset->second.struct_value().fields()) {
    if (key == "transforms") {
      if (absl::Status s = CheckList(value, "dataset.transforms"); !s.ok()) return s;
    } else if (key == "testTransforms" || key == "test_transforms") {
      if (absl::Status s = CheckList(value, "dataset.testTransforms"); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

namespace {

void Canonical(google::protobuf::RepeatedPtrField<v1::ImageTransform>* steps,
               v1::DatasetSpec* data) {
  for (int i = steps->size() - 1; i >= 0; --i) {
    if ((*steps)[i].kind() == "ToTensor") steps->erase(steps->begin() + i);
  }
  if (steps->empty() || steps->rbegin()->kind() != "Normalize") return;
  const v1::ImageTransform& last = *steps->rbegin();
  v1::ImageNormalize normalize;
  *normalize.mutable_mean() = last.mean();
  *normalize.mutable_std() = last.std();
  if (data->has_normalize() &&
      !google::protobuf::util::MessageDifferencer::Equals(data->normalize(), normalize)) {
    return;  // two normalizations: the check refuses the step
  }
  *data->mutable_normalize() = normalize;
  steps->RemoveLast();
}

}  // namespace

void CanonicalTransforms(v1::DatasetSpec* data) {
  Canonical(data->mutable_transforms(), data);
  Canonical(data->mutable_test_transforms(), data);
}

}  // namespace ddp
