// Criteo TSV parsing on hand-written lines: values, empty fields, hashing, bad lines, streaming
// batches, gzip, sharding.
#include "ferry/data/criteo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "test_files.h"

namespace ferry::data {
namespace {

using ::ferry::data::testing::TempFile;
using ::ferry::data::testing::WriteGzip;
using ::ferry::data::testing::WritePlain;
using ::testing::HasSubstr;

// A line from label, 13 integer strings and 26 categorical strings.
std::string Line(const std::string& label, const std::vector<std::string>& ints, const std::vector<std::string>& cats) {
  std::string s = label;
  for (const std::string& v : ints) s += "\t" + v;
  for (const std::string& v : cats) s += "\t" + v;
  return s;
}

std::vector<std::string> Ints(int base) {
  std::vector<std::string> v;
  for (int j = 0; j < 13; ++j) v.push_back(std::to_string(base + j));
  return v;
}

std::vector<std::string> Cats(int base) {
  std::vector<std::string> v;
  char buf[16];
  for (int f = 0; f < 26; ++f) {
    std::snprintf(buf, sizeof buf, "%08x", 0x68fd1e64u + static_cast<unsigned>(base * 100 + f));
    v.push_back(buf);
  }
  return v;
}

// A line whose label is `i % 2` and whose first integer feature is i, so examples are traceable.
std::string Numbered(int i) {
  std::vector<std::string> ints = Ints(0);
  ints[0] = std::to_string(i);
  return Line(std::to_string(i % 2), ints, Cats(i));
}

TEST(CriteoTest, ParsesAFullLine) {
  std::vector<std::string> ints = {"1", "-1", "0", "5", "", "1382", "4", "15", "2", "181", "1", "2", ""};
  std::vector<std::string> cats = Cats(0);
  cats[3] = "";
  cats[25] = "";
  CtrBatch batch;
  batch.Reset(kCriteoDense, kCriteoFields);
  ASSERT_TRUE(ParseCriteoLine(Line("1", ints, cats), 0, &batch).ok());
  ASSERT_EQ(batch.size(), 1);
  EXPECT_EQ(batch.labels[0], 1.0f);
  ASSERT_EQ(batch.dense.size(), 13u);
  EXPECT_FLOAT_EQ(batch.dense[0], std::log(2.0f));     // log(1 + 1)
  EXPECT_EQ(batch.dense[1], 0.0f);                     // -1 clamps to 0
  EXPECT_EQ(batch.dense[2], 0.0f);                     // log(1 + 0)
  EXPECT_FLOAT_EQ(batch.dense[3], std::log(6.0f));
  EXPECT_EQ(batch.dense[4], 0.0f);                     // empty
  EXPECT_FLOAT_EQ(batch.dense[5], std::log(1383.0f));
  EXPECT_EQ(batch.dense[12], 0.0f);                    // empty, last integer column
  ASSERT_EQ(batch.ids.size(), 26u);
  for (int f = 0; f < 26; ++f) {
    EXPECT_EQ(batch.ids[f], CriteoFieldId(f, cats[f])) << f;
    EXPECT_GE(batch.ids[f], 0);
  }
  // Empty categorical fields map to the field's own "missing" id.
  EXPECT_EQ(batch.ids[3], CriteoFieldId(3, ""));
  EXPECT_EQ(batch.ids[25], CriteoFieldId(25, ""));
  EXPECT_NE(batch.ids[3], batch.ids[25]);
}

TEST(CriteoTest, AllEmptyFeaturesAndCrlf) {
  CtrBatch batch;
  batch.Reset(kCriteoDense, kCriteoFields);
  const std::string line = "0" + std::string(39, '\t') + "\r";
  ASSERT_TRUE(ParseCriteoLine(line, 0, &batch).ok());
  EXPECT_EQ(batch.labels[0], 0.0f);
  EXPECT_EQ(batch.dense, std::vector<float>(13, 0.0f));
  for (int f = 0; f < 26; ++f) EXPECT_EQ(batch.ids[f], CriteoFieldId(f, ""));
}

TEST(CriteoTest, FieldIdsAreStableAndPerField) {
  // Pinned values: the id of a value must never change between builds (embeddings are keyed by
  // it). If this fails, the hash changed: that breaks every saved model.
  // (Computed independently from the formula documented in criteo.h.)
  EXPECT_EQ(CriteoFieldId(0, ""), 1948871140692137074);
  EXPECT_EQ(CriteoFieldId(0, "68fd1e64"), 7110095864571872725);
  EXPECT_EQ(CriteoFieldId(25, ""), 6085853619906713804);
  EXPECT_EQ(CriteoFieldId(3, "05db9164"), 8746939432265901581);
  EXPECT_EQ(CriteoFieldId(7, "68fd1e64", 1000000), 7613139);
  EXPECT_EQ(CriteoFieldId(0, "68fd1e64"), CriteoFieldId(0, "68fd1e64"));
  EXPECT_NE(CriteoFieldId(0, "68fd1e64"), CriteoFieldId(1, "68fd1e64"));
  EXPECT_NE(CriteoFieldId(0, "68fd1e64"), CriteoFieldId(0, "68FD1E64"));  // case-sensitive
  // Hashing trick: field f owns [f * B, (f + 1) * B).
  constexpr int64_t kBuckets = 1000;
  std::set<int64_t> seen;
  for (int f = 0; f < 26; ++f) {
    for (int v = 0; v < 50; ++v) {
      const int64_t id = CriteoFieldId(f, std::to_string(v), kBuckets);
      EXPECT_GE(id, f * kBuckets);
      EXPECT_LT(id, (f + 1) * kBuckets);
      seen.insert(id);
    }
  }
  EXPECT_GT(seen.size(), 26u * 45);  // few collisions among 50 values in 1000 buckets
}

TEST(CriteoTest, BadLinesAreRejectedWithReasons) {
  CtrBatch batch;
  batch.Reset(kCriteoDense, kCriteoFields);
  auto reason = [&batch](const std::string& line) {
    Status s = ParseCriteoLine(line, 0, &batch);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << line;
    return s.message();
  };
  const std::string good = Line("1", Ints(1), Cats(1));
  EXPECT_THAT(reason(good + "\textra"), HasSubstr("41 tab-separated fields, expected 40"));
  EXPECT_THAT(reason(good.substr(0, good.rfind('\t'))), HasSubstr("39 tab-separated fields"));
  EXPECT_THAT(reason(""), HasSubstr("1 tab-separated fields"));
  EXPECT_THAT(reason(Line("2", Ints(1), Cats(1))), HasSubstr("label \"2\" is not 0 or 1"));
  EXPECT_THAT(reason(Line("", Ints(1), Cats(1))), HasSubstr("label \"\""));
  std::vector<std::string> ints = Ints(1);
  ints[6] = "abc";
  EXPECT_THAT(reason(Line("0", ints, Cats(1))), HasSubstr("I7 \"abc\" is not a decimal int64"));
  ints[6] = "1.5";
  EXPECT_THAT(reason(Line("0", ints, Cats(1))), HasSubstr("I7 \"1.5\""));
  ints[6] = "99999999999999999999";  // overflows int64
  EXPECT_THAT(reason(Line("0", ints, Cats(1))), HasSubstr("I7"));
  ints[6] = " 3";
  EXPECT_THAT(reason(Line("0", ints, Cats(1))), HasSubstr("I7"));
  std::vector<std::string> cats = Cats(1);
  cats[4] = "68fd1e6g";  // not hexadecimal
  EXPECT_THAT(reason(Line("0", Ints(1), cats)), HasSubstr("categorical C5 \"68fd1e6g\" is not hexadecimal"));
  CtrBatch misshapen;
  misshapen.Reset(13, 25);
  EXPECT_EQ(ParseCriteoLine(good, 0, &misshapen).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.size(), 0);  // nothing was appended
  EXPECT_TRUE(batch.dense.empty());
  EXPECT_TRUE(batch.ids.empty());
}

TEST(CriteoTest, StreamsBatchesAndCountsBadLines) {
  std::string text;
  std::vector<int> good;
  for (int i = 0; i < 7; ++i) {
    if (i == 2) {
      text += "1\tnot\tenough\tfields\n";  // line 3
    } else if (i == 5) {
      std::vector<std::string> ints = Ints(0);
      ints[0] = "x";
      text += Line("0", ints, Cats(0)) + "\n";  // line 6
    } else {
      text += Numbered(i) + "\n";
      good.push_back(i);
    }
  }
  text += Numbered(7);  // no final newline
  good.push_back(7);
  TempFile file(".tsv");
  WritePlain(file.path(), text);

  CriteoOptions options;
  options.max_bad_line_records = 1;
  StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open(file.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  CtrBatch batch;
  std::vector<int> seen;
  std::vector<int64_t> sizes;
  for (;;) {
    StatusOr<int64_t> n = (*reader)->ReadBatch(4, &batch);
    ASSERT_TRUE(n.ok()) << n.status();
    sizes.push_back(*n);
    if (*n == 0) break;
    ASSERT_EQ(batch.size(), *n);
    ASSERT_EQ(batch.num_dense, 13);
    ASSERT_EQ(batch.num_fields, 26);
    for (int64_t r = 0; r < batch.size(); ++r) {
      const int i = static_cast<int>(std::lround(std::expm1(batch.dense_row(r)[0])));
      seen.push_back(i);
      EXPECT_EQ(batch.labels[r], static_cast<float>(i % 2));
      EXPECT_EQ(batch.id_row(r)[0], CriteoFieldId(0, Cats(i)[0]));
    }
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 2, 0}));
  EXPECT_EQ(seen, good);
  const CriteoStats& stats = (*reader)->stats();
  EXPECT_EQ(stats.lines, 8);
  EXPECT_EQ(stats.examples, 6);
  EXPECT_EQ(stats.bad_lines, 2);
  ASSERT_EQ(stats.first_bad_lines.size(), 1u);  // only the first is kept
  EXPECT_EQ(stats.first_bad_lines[0].line_number, 3);
  EXPECT_THAT(stats.first_bad_lines[0].reason, HasSubstr("4 tab-separated fields"));

  // A second epoch sees the same examples again.
  ASSERT_TRUE((*reader)->Rewind().ok());
  EXPECT_EQ((*reader)->stats().lines, 0);
  StatusOr<int64_t> n = (*reader)->ReadBatch(100, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 6);
  EXPECT_EQ((*reader)->stats().bad_lines, 2);
}

TEST(CriteoTest, LinesLongerThanTheBufferAndGzip) {
  // Categorical values of 600 bytes make each line ~16 KB, far over a 1 KiB buffer.
  std::string text;
  std::vector<std::string> cats(26, std::string(600, 'a'));
  for (int i = 0; i < 20; ++i) {
    cats[0] = std::to_string(i) + std::string(600, 'b');
    std::vector<std::string> ints = Ints(0);
    ints[0] = std::to_string(i);
    text += Line("1", ints, cats) + "\n";
  }
  TempFile file(".tsv.gz");
  WriteGzip(file.path(), text);
  CriteoOptions options;
  options.read_buffer_bytes = 1024;
  StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open(file.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  CtrBatch batch;
  StatusOr<int64_t> n = (*reader)->ReadBatch(1000, &batch);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 20);
  EXPECT_EQ((*reader)->stats().bad_lines, 0);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(batch.id_row(i)[0], CriteoFieldId(0, std::to_string(i) + std::string(600, 'b')));
    EXPECT_EQ(batch.id_row(i)[1], CriteoFieldId(1, std::string(600, 'a')));
  }
}

TEST(CriteoTest, ShardsSplitLinesExactlyOnce) {
  constexpr int kLines = 23;
  std::string text;
  for (int i = 0; i < kLines; ++i) text += (i == 10 ? std::string("garbage") : Numbered(i)) + "\n";
  TempFile file(".tsv");
  WritePlain(file.path(), text);

  for (int m = 1; m <= 4; ++m) {
    std::multiset<int> seen;
    int64_t bad = 0, lines = 0;
    for (int r = 0; r < m; ++r) {
      CriteoOptions options;
      options.shard = {r, m};
      StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open(file.path(), options);
      ASSERT_TRUE(reader.ok()) << reader.status();
      CtrBatch batch;
      for (;;) {
        StatusOr<int64_t> n = (*reader)->ReadBatch(3, &batch);
        ASSERT_TRUE(n.ok());
        if (*n == 0) break;
        for (int64_t k = 0; k < *n; ++k) {
          const int i = static_cast<int>(std::lround(std::expm1(batch.dense_row(k)[0])));
          EXPECT_EQ(i % m, r) << "line " << i << " read by shard " << r << " of " << m;
          seen.insert(i);
        }
      }
      bad += (*reader)->stats().bad_lines;
      lines += (*reader)->stats().lines;
      for (const CriteoBadLine& b : (*reader)->stats().first_bad_lines) EXPECT_EQ(b.line_number, 11);
    }
    EXPECT_EQ(bad, 1) << m;
    EXPECT_EQ(lines, kLines) << m;
    ASSERT_EQ(seen.size(), static_cast<size_t>(kLines - 1)) << m;
    for (int i = 0; i < kLines; ++i) EXPECT_EQ(seen.count(i), i == 10 ? 0u : 1u) << i;
  }
}

TEST(CriteoTest, OpenErrors) {
  StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open("/nonexistent/day_0.gz");
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("/nonexistent/day_0.gz"));

  TempFile file(".tsv");
  WritePlain(file.path(), Numbered(0) + "\n");
  CriteoOptions options;
  options.shard = {2, 2};
  EXPECT_EQ(CriteoReader::Open(file.path(), options).status().code(), StatusCode::kInvalidArgument);
  options = CriteoOptions();
  options.hash_buckets = -1;
  EXPECT_EQ(CriteoReader::Open(file.path(), options).status().code(), StatusCode::kInvalidArgument);

  reader = CriteoReader::Open(file.path());
  ASSERT_TRUE(reader.ok());
  CtrBatch batch;
  EXPECT_EQ((*reader)->ReadBatch(0, &batch).status().code(), StatusCode::kInvalidArgument);
}

TEST(CriteoTest, TruncatedGzipIsAnErrorNotABadLine) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += Numbered(i) + "\n";
  const std::string gz = testing::Gzip(text);
  TempFile file(".tsv.gz");
  WritePlain(file.path(), gz.substr(0, gz.size() / 2));
  StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open(file.path());
  ASSERT_TRUE(reader.ok());
  CtrBatch batch;
  Status failure;
  for (;;) {
    StatusOr<int64_t> n = (*reader)->ReadBatch(256, &batch);
    if (!n.ok()) {
      failure = n.status();
      break;
    }
    ASSERT_GT(*n, 0) << "reached the end without noticing the truncation";
  }
  EXPECT_EQ(failure.code(), StatusCode::kDataLoss) << failure;
  EXPECT_THAT(failure.message(), HasSubstr(file.path()));
  // The reader stays failed.
  EXPECT_EQ((*reader)->ReadBatch(256, &batch).status().code(), StatusCode::kDataLoss);
}

// A folder of its own under the test's temporary folder, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "ferry_criteo_XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Reads every example of `reader`'s pass; returns the traced numbers (Numbered) in order.
std::vector<int> ReadAll(CriteoReader& reader, int64_t batch_size = 3) {
  std::vector<int> seen;
  CtrBatch batch;
  for (;;) {
    StatusOr<int64_t> n = reader.ReadBatch(batch_size, &batch);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    for (int64_t k = 0; k < *n; ++k) seen.push_back(static_cast<int>(std::lround(std::expm1(batch.dense_row(k)[0]))));
  }
  return seen;
}

// Files are read one after another (a batch spans them), bad lines name their file, and the
// stats count files and bytes.
TEST(CriteoTest, ReadsManyFilesInOrderAndNamesTheFileOfABadLine) {
  TempDir dir;
  std::vector<std::string> paths;
  std::string all;
  int next = 0;
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int i = 0; i < 5; ++i) text += Numbered(next++) + "\n";
    if (f == 1) text += "1\tbad\n";  // file 1, line 6
    paths.push_back(dir / ("day_" + std::to_string(f) + (f == 2 ? ".gz" : "")));
    if (f == 2) {
      WriteGzip(paths.back(), text);
    } else {
      WritePlain(paths.back(), text);
    }
    all += text;
  }
  auto reader = CriteoReader::Open(paths);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int> want(15);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(ReadAll(**reader, 4), want);
  const CriteoStats& st = (*reader)->stats();
  EXPECT_EQ(st.files, 3);
  EXPECT_EQ(st.examples, 15);
  EXPECT_EQ(st.bad_lines, 1);
  EXPECT_EQ(st.bytes, static_cast<int64_t>(all.size()));
  ASSERT_EQ(st.first_bad_lines.size(), 1u);
  EXPECT_EQ(st.first_bad_lines[0].ToString(), paths[1] + ":6: 2 tab-separated fields, expected 40");

  // Another pass reads them all again.
  ASSERT_TRUE((*reader)->Rewind().ok());
  EXPECT_EQ(ReadAll(**reader, 100), want);
  EXPECT_EQ((*reader)->stats().files, 3);

  // A missing file fails at Open, naming it, not when the reader reaches it.
  paths.push_back(dir / "day_9");
  EXPECT_EQ(CriteoReader::Open(paths).status().code(), StatusCode::kNotFound);
  EXPECT_THAT(CriteoReader::Open(paths).status().message(), HasSubstr("day_9"));
}

// By file, by line, or auto: over all shards every line is read exactly once, and by file each
// shard reads whole files (file i belongs to shard i % M).
TEST(CriteoTest, ShardsByFileOrByLineReadEveryLineOnce) {
  TempDir dir;
  std::vector<std::string> paths;
  std::vector<int> file_of;
  int next = 0;
  for (int f = 0; f < 5; ++f) {
    std::string text;
    for (int i = 0; i < 3 + f; ++i, ++next) {
      text += Numbered(next) + "\n";
      file_of.push_back(f);
    }
    paths.push_back(dir / ("part-" + std::to_string(f) + ".tsv"));
    WritePlain(paths.back(), text);
  }
  for (CriteoShardBy by : {CriteoShardBy::kFile, CriteoShardBy::kLine, CriteoShardBy::kAuto}) {
    for (int m = 1; m <= 5; ++m) {
      std::multiset<int> seen;
      for (int r = 0; r < m; ++r) {
        CriteoOptions o;
        o.shard = {r, m};
        o.shard_by = by;
        auto reader = CriteoReader::Open(paths, o);
        ASSERT_TRUE(reader.ok()) << reader.status();
        const bool by_file = by == CriteoShardBy::kFile || by == CriteoShardBy::kAuto;  // 5 files >= m
        EXPECT_EQ((*reader)->shard_by(), by_file ? CriteoShardBy::kFile : CriteoShardBy::kLine);
        for (int i : ReadAll(**reader)) {
          if (by_file) {
            EXPECT_EQ(file_of[static_cast<size_t>(i)] % m, r) << "example " << i;
          }
          seen.insert(i);
        }
      }
      ASSERT_EQ(seen.size(), file_of.size()) << CriteoShardByName(by) << " " << m;
      for (int i = 0; i < next; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
    }
  }
  // Six shards of five files by file: the sixth would have none.
  CriteoOptions o;
  o.shard = {5, 6};
  o.shard_by = CriteoShardBy::kFile;
  auto none = CriteoReader::Open(paths, o);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("shard by line instead"));
  o.shard_by = CriteoShardBy::kAuto;  // auto goes by line there
  ASSERT_TRUE(CriteoReader::Open(paths, o).ok());
  EXPECT_EQ(ParseCriteoShardBy("line").value(), CriteoShardBy::kLine);
  EXPECT_EQ(ParseCriteoShardBy("lines").status().code(), StatusCode::kInvalidArgument);
}

// A line over max_line_bytes is a bad line, read past without being held, wherever it falls in
// the read buffer: a 200 KB run without a newline (far over the buffer), a valid Criteo line of
// 5000 bytes (its end already in a large buffer), one of just over the limit, and one at the
// very end without a newline. The lines around them are read; one of exactly the limit is kept.
TEST(CriteoTest, ALineOverTheLimitIsABadLineNotHeld) {
  constexpr int64_t kLimit = 4096;
  auto valid_of_size = [](int i, size_t size) {  // Numbered(i) with its last value padded
    std::string line = Numbered(i);
    line += std::string(size - line.size(), 'f');
    return line;
  };
  const std::string text = Numbered(0) + "\n" + std::string(200000, 'x') + "\n" + valid_of_size(5, 5000) + "\n" +
                           valid_of_size(6, kLimit + 1) + "\n" + valid_of_size(2, kLimit) + "\n" + Numbered(1) + "\n" +
                           std::string(5000, 'y');
  TempFile file(".tsv");
  WritePlain(file.path(), text);
  for (int64_t buffer : {int64_t{1024}, int64_t{1} << 20}) {
    CriteoOptions o;
    o.read_buffer_bytes = buffer;
    o.max_line_bytes = kLimit;
    auto reader = CriteoReader::Open(file.path(), o);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(ReadAll(**reader), (std::vector<int>{0, 2, 1})) << "buffer " << buffer;
    const CriteoStats& st = (*reader)->stats();
    EXPECT_EQ(st.lines, 7);
    EXPECT_EQ(st.bad_lines, 4);
    EXPECT_EQ(st.bytes, static_cast<int64_t>(text.size()));
    ASSERT_EQ(st.first_bad_lines.size(), 4u);
    const int64_t want_lines[] = {2, 3, 4, 7};
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(st.first_bad_lines[k].line_number, want_lines[k]) << "buffer " << buffer;
      EXPECT_EQ(st.first_bad_lines[k].reason, "longer than 4096 bytes");
    }
  }
}

// A line is read past up to 64 times the limit (LineReader::kReadPastLines), then the file is refused as
// not text lines, naming it and the byte the line began at: /dev/zero would be read forever.
TEST(CriteoTest, AFileWithoutLineEndsIsRefusedNotReadForever) {
  constexpr int64_t kLimit = 4096;
  const std::string head = Numbered(0) + "\n" + Numbered(1) + "\n";
  const int64_t past = 64 * kLimit;  // LineReader::kReadPastLines (trainer/data/src/gz_file.h)
  // Reads every batch; the first error ends it.
  const auto read = [](CriteoReader& reader, std::vector<int>* seen) -> Status {
    CtrBatch batch;
    for (;;) {
      StatusOr<int64_t> n = reader.ReadBatch(3, &batch);
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::Ok();
      for (int64_t k = 0; k < *n; ++k)
        seen->push_back(static_cast<int>(std::lround(std::expm1(batch.dense_row(k)[0]))));
    }
  };
  for (const int64_t run : {past - kLimit, past + 2 * kLimit}) {  // within the bound, then beyond it
    TempFile file(".tsv");
    WritePlain(file.path(), head + std::string(static_cast<size_t>(run), 'z') + "\n" + Numbered(2) + "\n");
    CriteoOptions o;
    o.read_buffer_bytes = 1024;
    o.max_line_bytes = kLimit;
    auto reader = CriteoReader::Open(file.path(), o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<int> seen;
    const Status st = read(**reader, &seen);
    if (run < past) {
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
    } else {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
      EXPECT_THAT(st.message(), HasSubstr(file.path() + ": no line end in "));
      EXPECT_THAT(st.message(), HasSubstr(" bytes from byte " + std::to_string(head.size()) + ","));
    }
  }
  // The device itself, opened as ferry-trainer opens its files.
  auto zero = CriteoReader::Open("/dev/zero", CriteoOptions{});
  ASSERT_TRUE(zero.ok()) << zero.status();
  std::vector<int> seen;
  const Status st = read(**zero, &seen);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("/dev/zero: no line end in "));
  EXPECT_TRUE(seen.empty());
}

TEST(CriteoTest, ExpandsListsAndGlobs) {
  TempDir dir;
  for (const char* name : {"day_2.gz", "day_0.gz", "day_1.gz", "other.tsv"}) WritePlain(dir / name, "");
  auto got = ExpandCriteoPaths(dir / "day_*.gz");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{dir / "day_0.gz", dir / "day_1.gz", dir / "day_2.gz"}));
  got = ExpandCriteoPaths(dir / "other.tsv" + "," + dir / "day_[01].gz" + "," + dir / "day_0.gz");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{dir / "other.tsv", dir / "day_0.gz", dir / "day_1.gz"}));
  // Numbers in order, as the 24 days of the Criteo 1 TB logs are named.
  for (const char* name : {"day_10.gz", "day_9.gz", "day_23.gz", "day_02.gz"}) WritePlain(dir / name, "");
  got = ExpandCriteoPaths(dir / "day_*.gz");
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<std::string> names;
  for (const std::string& p : *got) names.push_back(std::filesystem::path(p).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"day_0.gz", "day_1.gz", "day_2.gz", "day_02.gz", "day_9.gz", "day_10.gz",
                                             "day_23.gz"}));
  EXPECT_EQ(ExpandCriteoPaths(dir / "day_*.tsv").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ExpandCriteoPaths(dir / "day_*.tsv").status().message(), HasSubstr("no file matches"));
  EXPECT_EQ(ExpandCriteoPaths(dir / "day_7.gz").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ExpandCriteoPaths("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpandCriteoPaths(dir / "day_0.gz,").status().code(), StatusCode::kInvalidArgument);
}

std::vector<int> Traced(const CtrBatch& batch) {
  std::vector<int> out;
  for (int64_t k = 0; k < batch.size(); ++k)
    out.push_back(static_cast<int>(std::lround(std::expm1(batch.dense_row(k)[0]))));
  return out;
}

// A stream hands out exactly n examples a call, beginning the next pass where one ends (a batch
// spans the two), reports each finished pass, caps a pass at pass_limit, and Skip(k) leaves it
// where k examples of Next would.
TEST(CriteoTest, AStreamPassesOverItsFilesAgainAndSkipsLikeItReads) {
  std::string text;
  for (int i = 0; i < 7; ++i) text += Numbered(i) + "\n";
  text += "bad\n";
  TempFile file(".tsv");
  WritePlain(file.path(), text);
  auto open = [&] {
    auto r = CriteoReader::Open(file.path());
    EXPECT_TRUE(r.ok());
    return std::move(*r);
  };
  CriteoStream stream(open());
  CtrBatch batch;
  ASSERT_TRUE(stream.Next(5, &batch).ok());
  EXPECT_EQ(Traced(batch), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(stream.TakeFinishedPasses().empty());
  ASSERT_TRUE(stream.Next(5, &batch).ok());
  EXPECT_EQ(Traced(batch), (std::vector<int>{5, 6, 0, 1, 2}));
  EXPECT_EQ(stream.pass(), 1);
  std::vector<CriteoPass> done = stream.TakeFinishedPasses();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].pass, 0);
  EXPECT_EQ(done[0].stats.examples, 7);
  EXPECT_EQ(done[0].stats.bad_lines, 1);

  for (int skip : {0, 3, 7, 12, 20}) {
    CriteoStream read(open()), skipped(open());
    ASSERT_TRUE(read.Next(skip + 4, &batch).ok());
    const std::vector<int> all = Traced(batch);
    ASSERT_TRUE(skipped.Skip(skip).ok());
    ASSERT_TRUE(skipped.Next(4, &batch).ok());
    EXPECT_EQ(Traced(batch), std::vector<int>(all.end() - 4, all.end())) << "skip " << skip;
    EXPECT_EQ(skipped.pass(), read.pass()) << "skip " << skip;
  }

  CriteoStream limited(open(), /*pass_limit=*/3);
  ASSERT_TRUE(limited.Next(7, &batch).ok());
  EXPECT_EQ(Traced(batch), (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));

  TempFile junk(".tsv");
  WritePlain(junk.path(), "bad\nworse\n");
  auto r = CriteoReader::Open(junk.path());
  ASSERT_TRUE(r.ok());
  CriteoStream empty(std::move(*r));
  const Status s = empty.Next(1, &batch);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no usable example"));
  EXPECT_THAT(s.message(), HasSubstr(junk.path() + ":2: 1 tab-separated fields"));
}

// Read-ahead changes nothing but when the parsing happens: the same examples in the same order,
// the same passes reported, for batches of one size and of changing sizes, after a Skip; and an
// error met ahead (a truncated gzip file) is returned by the same Next as without read-ahead.
TEST(CriteoTest, ReadAheadHandsOutExactlyWhatReadingInLineDoes) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += (i % 11 == 3 ? std::string("bad") : Numbered(i)) + "\n";
  TempFile file(".tsv.gz");
  WriteGzip(file.path(), text);
  auto open = [&](bool ahead, int64_t limit) {
    auto r = CriteoReader::Open(file.path());
    EXPECT_TRUE(r.ok());
    return std::make_unique<CriteoStream>(std::move(*r), limit, ahead);
  };
  for (int64_t limit : {int64_t{0}, int64_t{17}}) {
    for (const std::vector<int64_t>& sizes :
         {std::vector<int64_t>(12, 8), std::vector<int64_t>{5, 5, 13, 2, 40, 7, 7, 1, 30}}) {
      auto plain = open(false, limit), ahead = open(true, limit);
      ASSERT_TRUE(plain->Skip(9).ok());
      ASSERT_TRUE(ahead->Skip(9).ok());
      CtrBatch a, b;
      for (size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_TRUE(plain->Next(sizes[k], &a).ok());
        ASSERT_TRUE(ahead->Next(sizes[k], &b).ok());
        EXPECT_EQ(Traced(b), Traced(a)) << "batch " << k << ", limit " << limit;
        EXPECT_EQ(b.ids, a.ids);
        EXPECT_EQ(b.labels, a.labels);
        const auto pa = plain->TakeFinishedPasses(), pb = ahead->TakeFinishedPasses();
        ASSERT_EQ(pb.size(), pa.size()) << "batch " << k;
        for (size_t j = 0; j < pa.size(); ++j) {
          EXPECT_EQ(pb[j].pass, pa[j].pass);
          EXPECT_EQ(pb[j].stats.examples, pa[j].stats.examples);
          EXPECT_EQ(pb[j].stats.bad_lines, pa[j].stats.bad_lines);
        }
        EXPECT_EQ(ahead->pass(), plain->pass()) << "batch " << k;
      }
    }
  }

  std::string big;
  for (int i = 0; i < 20000; ++i) big += Numbered(i) + "\n";
  const std::string gz = testing::Gzip(big);
  TempFile cut(".tsv.gz");
  WritePlain(cut.path(), gz.substr(0, gz.size() * 3 / 4));
  auto failing = [&](bool ahead) {
    auto r = CriteoReader::Open(cut.path());
    EXPECT_TRUE(r.ok());
    CriteoStream s(std::move(*r), 0, ahead);
    CtrBatch batch;
    for (int k = 0; k < 1000; ++k) {
      const Status st = s.Next(500, &batch);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
        EXPECT_EQ(s.Next(10, &batch).code(), StatusCode::kDataLoss) << "the stream does not stay failed";
        return k;
      }
    }
    return -1;
  };
  const int without = failing(false);
  EXPECT_GT(without, 0);
  EXPECT_EQ(failing(true), without);
}

}  // namespace
}  // namespace ferry::data
