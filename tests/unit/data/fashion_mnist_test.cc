// IDX parsing on small files the test writes itself (each error case), and the real
// Fashion-MNIST files from the Debian package when they are installed.
#include "ferry/data/fashion_mnist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>

#include "test_files.h"

namespace ferry::data {
namespace {

using ::ferry::data::testing::Gzip;
using ::ferry::data::testing::IdxBytes;
using ::ferry::data::testing::TempFile;
using ::ferry::data::testing::WriteGzip;
using ::ferry::data::testing::WritePlain;
using ::testing::HasSubstr;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// Deterministic pixel bytes covering 0..255.
std::string Pixels(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + 11) % 256);
  return s;
}

// Three 2x3 images with labels {0, 9, 4}, gzipped.
struct SmallDataset {
  TempFile images{"-images.gz"};
  TempFile labels{"-labels.gz"};
  std::string pixels = Pixels(3 * 2 * 3);
  SmallDataset() {
    WriteGzip(images.path(), IdxBytes(kImagesMagic, {3, 2, 3}, pixels));
    WriteGzip(labels.path(), IdxBytes(kLabelsMagic, {3}, std::string("\x00\x09\x04", 3)));
  }
};

TEST(IdxTest, ReadsGzippedImagesAndLabels) {
  SmallDataset files;
  StatusOr<ImageDataset> data = ReadIdxImageDataset(files.images.path(), files.labels.path(), 10);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 3);
  EXPECT_EQ(data->rows, 2);
  EXPECT_EQ(data->cols, 3);
  EXPECT_EQ(data->num_classes, 10);
  EXPECT_EQ(data->pixels_per_image(), 6);
  ASSERT_EQ(data->images.size(), 18u);
  for (size_t i = 0; i < 18; ++i) {
    EXPECT_FLOAT_EQ(data->images[i], static_cast<uint8_t>(files.pixels[i]) / 255.0f) << i;
  }
  EXPECT_EQ(data->labels, (std::vector<int32_t>{0, 9, 4}));
  EXPECT_FLOAT_EQ(data->image(1)[0], static_cast<uint8_t>(files.pixels[6]) / 255.0f);

  std::vector<float> images;
  std::vector<int32_t> labels;
  const std::vector<int64_t> picks = {2, 0};
  ASSERT_TRUE(data->Gather(picks, &images, &labels).ok());
  EXPECT_EQ(labels, (std::vector<int32_t>{4, 0}));
  ASSERT_EQ(images.size(), 12u);
  EXPECT_TRUE(std::equal(images.begin(), images.begin() + 6, data->image(2).begin()));
  EXPECT_TRUE(std::equal(images.begin() + 6, images.end(), data->image(0).begin()));

  const std::vector<int64_t> bad_picks = {1, 3};
  Status s = data->Gather(bad_picks, &images, &labels);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
}

TEST(IdxTest, ReadsPlainFilesToo) {
  TempFile file("-labels");
  WritePlain(file.path(), IdxBytes(kLabelsMagic, {4}, std::string("\x01\x02\x03\x04", 4)));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(array->data, (std::vector<uint8_t>{1, 2, 3, 4}));
}

TEST(IdxTest, EmptyArrayIsValid) {
  TempFile file("-labels.gz");
  WriteGzip(file.path(), IdxBytes(kLabelsMagic, {0}, ""));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->data.empty());
}

TEST(IdxTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "ferry_data_no_such_file.gz";
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(path, 3);
  EXPECT_EQ(array.status().code(), StatusCode::kNotFound) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST(IdxTest, DirectoryIsRejected) {
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(::testing::TempDir(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kInvalidArgument) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr("directory"));
}

TEST(IdxTest, BadMagicNamesFileAndBothNumbers) {
  TempFile file("-images.gz");
  // A labels file where images are expected.
  WriteGzip(file.path(), IdxBytes(kLabelsMagic, {2}, "ab"));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(file.path()));
  EXPECT_THAT(array.status().message(), HasSubstr("bad IDX magic 0x00000801, expected 0x00000803"));
  EXPECT_THAT(array.status().message(), HasSubstr("in 1 dimensions"));

  // Float elements (type 0x0d) are not unsigned bytes.
  WriteGzip(file.path(), IdxBytes(0x00000d03, {1, 1, 1}, "abcd"));
  array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("bad IDX magic 0x00000d03"));

  // Garbage that is not IDX at all (read as a plain file).
  WritePlain(file.path(), "hello world\n");
  array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("bad IDX magic 0x68656c6c"));
}

TEST(IdxTest, TruncatedHeader) {
  TempFile file("-images.gz");
  WriteGzip(file.path(), std::string("\x00\x00", 2));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("truncated IDX header: 2 bytes"));

  // The magic and one of three dimension sizes.
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {5}, ""));
  array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("3 dimension sizes need 12 bytes, found 4"));
}

TEST(IdxTest, TruncatedData) {
  TempFile file("-images.gz");
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {3, 2, 3}, Pixels(17)));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(file.path()));
  EXPECT_THAT(array.status().message(), HasSubstr("dimensions 3x2x3 need 18 bytes after the header, the file has 17"));
}

TEST(IdxTest, OverLongData) {
  TempFile file("-images.gz");
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {3, 2, 3}, Pixels(19)));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr("over-long"));
}

TEST(IdxTest, LyingHeaderDoesNotAllocateItsClaim) {
  TempFile file("-images.gz");
  // Claims 2^31-1 x 2^31-1 x 2^31-1 bytes: rejected before reading.
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {0x7fffffff, 0x7fffffff, 0x7fffffff}, "x"));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("exceed the limit"));

  // Claims 4 GB (under the limit) but holds 10 bytes: a truncation error, not a 4 GB buffer.
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {1 << 22, 32, 32}, Pixels(10)));
  array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("the file has 10"));
}

TEST(IdxTest, DimensionsWhoseProductOverflows64BitsAreRejected) {
  TempFile file("-images.gz");
  // (2^32-1) x 4 stays under the limit; x (2^32-1) is about 2^66, which wraps a 64-bit product to
  // a negative count: it must be refused by the size check, not reach the allocator.
  WriteGzip(file.path(), IdxBytes(kImagesMagic, {0xffffffffu, 4, 0xffffffffu}, Pixels(10)));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(file.path()));
  EXPECT_THAT(array.status().message(), HasSubstr("4294967295x4x4294967295... exceed the limit"));

  // The same through the dataset reader, as ferry-trainer uses it.
  TempFile labels("-labels.gz");
  WriteGzip(labels.path(), IdxBytes(kLabelsMagic, {1}, std::string(1, '\0')));
  StatusOr<ImageDataset> data = ReadIdxImageDataset(file.path(), labels.path(), 10);
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(file.path()));
}

TEST(IdxTest, CorruptGzipStream) {
  const std::string idx = IdxBytes(kImagesMagic, {1000, 28, 28}, Pixels(1000 * 28 * 28));
  const std::string gz = Gzip(idx);
  TempFile file("-images.gz");

  // Cut in half: the deflate stream ends early.
  WritePlain(file.path(), gz.substr(0, gz.size() / 2));
  StatusOr<IdxUbyteArray> array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(file.path()));
  EXPECT_THAT(array.status().message(), HasSubstr("gzip"));

  // A flipped bit in the CRC-32 trailer.
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0x01;
  WritePlain(file.path(), bad_crc);
  array = ReadIdxUbyte(file.path(), 3);
  EXPECT_EQ(array.status().code(), StatusCode::kDataLoss) << array.status();

  // The intact stream reads back.
  WritePlain(file.path(), gz);
  array = ReadIdxUbyte(file.path(), 3);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->data.size(), 1000u * 28 * 28);
}

TEST(IdxTest, ImageLabelCountMismatch) {
  SmallDataset files;
  WriteGzip(files.labels.path(), IdxBytes(kLabelsMagic, {2}, std::string("\x00\x01", 2)));
  StatusOr<ImageDataset> data = ReadIdxImageDataset(files.images.path(), files.labels.path(), 10);
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr("count mismatch"));
  EXPECT_THAT(data.status().message(), HasSubstr(files.images.path() + " holds 3 images"));
  EXPECT_THAT(data.status().message(), HasSubstr(files.labels.path() + " holds 2 labels"));
}

TEST(IdxTest, LabelOutOfRange) {
  SmallDataset files;
  WriteGzip(files.labels.path(), IdxBytes(kLabelsMagic, {3}, std::string("\x00\x0a\x01", 3)));
  StatusOr<ImageDataset> data = ReadIdxImageDataset(files.images.path(), files.labels.path(), 10);
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(data.status().message(), HasSubstr(files.labels.path()));
  EXPECT_THAT(data.status().message(), HasSubstr("label 10 of example 1 is not in [0, 10)"));
}

TEST(IdxTest, ImagesWithoutPixelsAreRejected) {
  SmallDataset files;
  WriteGzip(files.images.path(), IdxBytes(kImagesMagic, {3, 0, 28}, ""));
  StatusOr<ImageDataset> data = ReadIdxImageDataset(files.images.path(), files.labels.path(), 10);
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss) << data.status();
}

TEST(IdxTest, BadArguments) {
  SmallDataset files;
  EXPECT_EQ(ReadIdxImageDataset(files.images.path(), files.labels.path(), 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadIdxUbyte(files.labels.path(), 0).status().code(), StatusCode::kInvalidArgument);
}

// --- The real Fashion-MNIST --------------------------------------------------------------------

bool FashionMnistInstalled(FashionMnistSplit split) {
  return std::filesystem::exists(FashionMnistImagesPath(kFashionMnistDir, split)) &&
         std::filesystem::exists(FashionMnistLabelsPath(kFashionMnistDir, split));
}

// Loads a split and checks its shape, class balance and pixel statistics; returns it through `out`.
void CheckRealSplit(FashionMnistSplit split, int64_t expected_count, ImageDataset* out) {
  StatusOr<ImageDataset> data = LoadFashionMnist(split);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, expected_count);
  EXPECT_EQ(data->rows, 28);
  EXPECT_EQ(data->cols, 28);
  EXPECT_EQ(data->num_classes, 10);
  ASSERT_EQ(data->images.size(), static_cast<size_t>(expected_count) * 784);
  ASSERT_EQ(data->labels.size(), static_cast<size_t>(expected_count));

  std::vector<int64_t> histogram(10, 0);
  for (int32_t label : data->labels) histogram[static_cast<size_t>(label)]++;
  EXPECT_EQ(histogram, std::vector<int64_t>(10, expected_count / 10));

  const auto [lo, hi] = std::minmax_element(data->images.begin(), data->images.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
  // Fashion-MNIST's mean pixel is about 0.286 (train) / 0.287 (test).
  const double mean = std::accumulate(data->images.begin(), data->images.end(), 0.0) / data->images.size();
  EXPECT_NEAR(mean, 0.286, 0.01);
  *out = std::move(*data);
}

TEST(FashionMnistTest, RealTrainSplit) {
  if (!FashionMnistInstalled(FashionMnistSplit::kTrain)) {
    GTEST_SKIP() << "Fashion-MNIST is not installed ("
                 << FashionMnistImagesPath(kFashionMnistDir, FashionMnistSplit::kTrain)
                 << " missing); apt-get install dataset-fashion-mnist";
  }
  ImageDataset data;
  ASSERT_NO_FATAL_FAILURE(CheckRealSplit(FashionMnistSplit::kTrain, 60000, &data));
  // The first training images: ankle boot, T-shirt/top, T-shirt/top, dress.
  EXPECT_EQ(data.labels[0], 9);
  EXPECT_EQ(data.labels[1], 0);
  EXPECT_EQ(data.labels[2], 0);
  EXPECT_EQ(data.labels[3], 3);
}

TEST(FashionMnistTest, RealTestSplit) {
  if (!FashionMnistInstalled(FashionMnistSplit::kTest)) {
    GTEST_SKIP() << "Fashion-MNIST is not installed ("
                 << FashionMnistImagesPath(kFashionMnistDir, FashionMnistSplit::kTest)
                 << " missing); apt-get install dataset-fashion-mnist";
  }
  ImageDataset data;
  ASSERT_NO_FATAL_FAILURE(CheckRealSplit(FashionMnistSplit::kTest, 10000, &data));
  // The first test images: ankle boot, pullover.
  EXPECT_EQ(data.labels[0], 9);
  EXPECT_EQ(data.labels[1], 2);
}

TEST(FashionMnistTest, MissingDirectoryNamesThePackage) {
  StatusOr<ImageDataset> data = LoadFashionMnist(FashionMnistSplit::kTrain, "/nonexistent/fashion-mnist");
  EXPECT_EQ(data.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(data.status().message(), HasSubstr("dataset-fashion-mnist"));
}

}  // namespace
}  // namespace ferry::data
