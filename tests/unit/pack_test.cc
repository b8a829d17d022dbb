// ddp-pack's index and the sources that read it: what a damaged or hostile
// index is refused for, a record read back as packed or refused naming its
// shard, and bad samples replaced the same way whatever reads them.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/data/pack_index.h"
#include "worker/data/packed_source.h"
#include "worker/data/skipping_source.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddp-pack-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `n` records of two floats each, {i, -i}, label i % 3, in shards of
  // three records.
  v1::PackIndex PackFloats(int n) {
    PackWriter writer(dir_, kPayloadFloat32, {2}, {"a", "b", "c"}, 3 * 8);
    for (int i = 0; i < n; ++i) {
      const float row[2] = {static_cast<float>(i), static_cast<float>(-i)};
      EXPECT_TRUE(writer.Add(absl::string_view(reinterpret_cast<const char*>(row), 8), i % 3).ok());
    }
    EXPECT_EQ(*writer.Finish("test"), static_cast<uint64_t>(n));
    return *ParsePackIndex(ReadIndex(), "index");
  }
  std::string ReadIndex() {
    std::ifstream in(absl::StrCat(dir_, "/", kPackIndexName), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::shared_ptr<const PackedSource> Open(v1::PackIndex index) {
    auto source = PackedSource::Open(std::move(index), dir_, ImagePipeline{}, 1);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? *source : nullptr;
  }

  std::string dir_;
};

TEST_F(PackTest, RecordsReadBackAsPackedAcrossShards) {
  v1::PackIndex index = PackFloats(10);
  EXPECT_EQ(index.files_size(), 4);  // 3 + 3 + 3 + 1
  auto source = Open(index);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->size(), 10u);
  EXPECT_EQ(source->sample_shape(), (std::vector<int64_t>{2}));
  for (int i : {0, 4, 9}) {
    float out[2];
    EXPECT_EQ(*source->Read(i, 0, out), i % 3);
    EXPECT_EQ(out[0], static_cast<float>(i));
    EXPECT_EQ(out[1], static_cast<float>(-i));
  }
}

TEST_F(PackTest, ALimitKeepsTheFirstRecords) {
  PackFloats(10);
  auto index = ParsePackIndex(ReadIndex(), "index", 4);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->record_file_size(), 4);
  EXPECT_EQ(index->record_crc32_size(), 4);
}

TEST_F(PackTest, ADamagedRecordIsNamedByItsShard) {
  v1::PackIndex index = PackFloats(6);
  auto source = Open(index);
  ASSERT_NE(source, nullptr);
  {
    std::fstream shard(absl::StrCat(dir_, "/shard-00001.ddp-rec"),
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(9);
    shard.put('\x7f');
  }
  float out[2];
  EXPECT_TRUE(source->Read(0, 0, out).ok());
  EXPECT_THAT(source->Read(4, 0, out).status().message(),
              AllOf(HasSubstr("shard-00001.ddp-rec (record 4)"), HasSubstr("CRC-32")));
}

TEST_F(PackTest, ADamagedRecordOfAnImagePackIsNamedByTheImageItCameFrom) {
  {
    PackWriter writer(dir_, kPayloadFloat32, {2}, {"a"}, 1 << 20);
    for (int i = 0; i < 3; ++i) {
      const float row[2] = {1, 2};
      ASSERT_TRUE(writer
                      .Add(absl::string_view(reinterpret_cast<const char*>(row), 8), 0,
                           absl::StrCat("cats/", i, ".png"))
                      .ok());
    }
    ASSERT_TRUE(writer.Finish("test").ok());
  }
  auto source = Open(*ParsePackIndex(ReadIndex(), "index"));
  ASSERT_NE(source, nullptr);
  {
    std::fstream shard(absl::StrCat(dir_, "/shard-00000.ddp-rec"),
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(17);
    shard.put('\x7f');
  }
  float out[2];
  EXPECT_THAT(source->Read(2, 0, out).status().message(),
              AllOf(HasSubstr("packed from cats/2.png"), HasSubstr("CRC-32")));
  // A hostile index whose names are not one per record is refused.
  v1::PackIndex index = *ParsePackIndex(ReadIndex(), "index");
  index.add_record_source("extra.png");
  EXPECT_THAT(ParsePackIndex(index.SerializeAsString(), "index"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("differ in length")));
}

TEST_F(PackTest, AShardOfAnotherSizeOrGoneIsRefusedAtOpen) {
  v1::PackIndex index = PackFloats(6);
  {
    std::ofstream shard(absl::StrCat(dir_, "/shard-00000.ddp-rec"),
                        std::ios::app | std::ios::binary);
    shard << "x";
  }
  auto grown = PackedSource::Open(index, dir_, ImagePipeline{}, 1);
  EXPECT_THAT(grown.status().message(),
              AllOf(HasSubstr("shard-00000.ddp-rec: has 25 bytes, not the 24"),
                    HasSubstr("changed since")));
  std::filesystem::remove(absl::StrCat(dir_, "/shard-00001.ddp-rec"));
  std::filesystem::resize_file(absl::StrCat(dir_, "/shard-00000.ddp-rec"), 24);
  EXPECT_THAT(PackedSource::Open(index, dir_, ImagePipeline{}, 1).status().message(),
              AllOf(HasSubstr("shard-00001.ddp-rec: can't be opened"), HasSubstr("vanished")));
}

TEST_F(PackTest, AFileThatIsALinkIsFollowed) {
  // As torchvision follows links in an image folder (a manifest lists the
  // folder's files as its walk found them).
  v1::PackIndex index = PackFloats(4);
  const std::string shard = absl::StrCat(dir_, "/shard-00001.ddp-rec");
  std::filesystem::rename(shard, absl::StrCat(dir_, "/elsewhere.bin"));
  std::filesystem::create_symlink("elsewhere.bin", shard);
  auto source = Open(index);
  ASSERT_NE(source, nullptr);
  float out[2];
  EXPECT_EQ(*source->Read(3, 0, out), 0);
  EXPECT_EQ(out[0], 3.0f);
}

TEST_F(PackTest, FloatPacksTakeNoTransforms) {
  v1::PackIndex index = PackFloats(3);
  ImagePipeline flip;
  flip.steps.push_back(ImageStep{ImageStep::Kind::kRandomHorizontalFlip});
  EXPECT_THAT(PackedSource::Open(index, dir_, flip, 1).status().message(),
              HasSubstr("transforms and normalize are for packed images"));
}

TEST_F(PackTest, AHostileIndexIsRefusedBeforeAnythingIsRead) {
  const v1::PackIndex good = PackFloats(3);
  auto refused = [](const v1::PackIndex& index) {
    return std::string(ParsePackIndex(index.SerializeAsString(), "idx").status().message());
  };
  EXPECT_TRUE(ParsePackIndex(good.SerializeAsString(), "idx").ok());
  EXPECT_THAT(std::string(ParsePackIndex("\xff\xff garbage", "idx").status().message()),
              HasSubstr("idx: can't be parsed"));
  v1::PackIndex bad = good;
  bad.set_payload("exe");
  EXPECT_THAT(refused(bad), HasSubstr("unknown payload"));
  bad = good;
  bad.mutable_files(0)->set_name("../../etc/passwd");
  EXPECT_THAT(refused(bad), HasSubstr("is not inside its folder"));
  bad = good;
  bad.mutable_files(0)->set_name("/etc/passwd");
  EXPECT_THAT(refused(bad), HasSubstr("is not inside its folder"));
  bad = good;
  bad.add_record_label(0);
  EXPECT_THAT(refused(bad), HasSubstr("differ in length"));
  bad = good;
  bad.set_record_offset(1, 1u << 30);
  EXPECT_THAT(refused(bad), HasSubstr("record 1 does not lie inside its file"));
  bad = good;
  bad.set_record_offset(1, ~uint64_t{0} - 2);  // offset + length wraps
  EXPECT_THAT(refused(bad), HasSubstr("record 1 does not lie inside its file"));
  bad = good;
  bad.set_record_file(2, 7);
  EXPECT_THAT(refused(bad), HasSubstr("record 2 names file 7"));
  bad = good;
  bad.set_record_label(0, 3);
  EXPECT_THAT(refused(bad), HasSubstr("label is not one of its 3 classes"));
  bad = good;
  bad.set_sample_shape(0, 3);
  EXPECT_THAT(refused(bad), HasSubstr("has 8 bytes, not 12"));
  bad = good;
  bad.clear_record_file();
  bad.clear_record_offset();
  bad.clear_record_length();
  bad.clear_record_label();
  bad.clear_record_crc32();
  EXPECT_THAT(refused(bad), HasSubstr("lists no record"));
}

// A source whose samples in `bad` fail; the others give their index.
class SomeBad : public SampleSource {
 public:
  SomeBad(size_t n, std::set<int64_t> bad) : n_(n), bad_(std::move(bad)) {}
  size_t size() const override { return n_; }
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<int64_t>& sample_shape() const override { return shape_; }
  absl::StatusOr<int64_t> Read(int64_t index, uint64_t, float* out) const override {
    if (bad_.count(index)) return absl::InvalidArgumentError(absl::StrCat("f", index, ": bad"));
    out[0] = static_cast<float>(index);
    return index;
  }

 private:
  size_t n_;
  std::set<int64_t> bad_;
  std::vector<std::string> classes_ = {"x"};
  std::vector<int64_t> shape_ = {1};
};

TEST(SkippingSourceTest, ABadSampleIsReplacedByTheSameOneWhoeverReadsIt) {
  auto inner = std::make_shared<SomeBad>(100, std::set<int64_t>{7, 8});
  SkippingSource a(inner), b(inner);
  float x = 0, y = 0;
  const int64_t label = *a.Read(7, 0, &x);
  EXPECT_NE(label, 7);
  EXPECT_EQ(*b.Read(7, 3, &y), label);  // another reader, another epoch
  EXPECT_EQ(x, y);
  EXPECT_EQ(*a.Read(9, 0, &x), 9);  // good samples are themselves
  a.Read(8, 0, &x).IgnoreError();
  a.Read(7, 1, &x).IgnoreError();
  SkippingSource::Skipped taken = a.Take(1);
  EXPECT_EQ(taken.replaced, 3u);
  EXPECT_THAT(taken.newly_bad, testing::ElementsAre("f7: bad"));
  taken = a.Take(8);  // the rest, each bad sample named once
  EXPECT_EQ(taken.replaced, 0u);
  EXPECT_THAT(taken.newly_bad, testing::ElementsAre("f8: bad"));
}

TEST(SkippingSourceTest, FailsWhenEveryCandidateIsBad) {
  std::set<int64_t> all;
  for (int64_t i = 0; i < 10; ++i) all.insert(i);
  SkippingSource source(std::make_shared<SomeBad>(10, all));
  float x;
  EXPECT_THAT(std::string(source.Read(3, 0, &x).status().message()),
              HasSubstr("sample 3 and the 16 samples tried in its place are all bad"));
}

TEST(SkippingSourceTest, ReplacementsSpreadOverTheDataset) {
  std::set<int64_t> seen;
  for (int attempt = 1; attempt <= 16; ++attempt) {
    const int64_t r = SkippingSource::Replacement(5, attempt, 1000);
    EXPECT_GE(r, 0);
    EXPECT_LT(r, 1000);
    seen.insert(r);
  }
  EXPECT_GE(seen.size(), 14u);
}

}  // namespace
}  // namespace ddp
