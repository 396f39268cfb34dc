// ferry/data/fashion_mnist.h — IDX files (gzipped or plain) and the Fashion-MNIST dataset.
//
// IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian int32 magic 0x000008NN (0x08 =
// unsigned byte elements, NN = number of dimensions), NN big-endian int32 dimension sizes, then
// the elements in row-major order. Images are IDX3 (0x00000803: count, rows, cols), labels IDX1
// (0x00000801: count).
//
// Files are read through zlib's gz* interface: gzipped files are decompressed as they stream in,
// plain files are read as they are. Everything is checked before it is trusted: magic, rank,
// dimension sizes against the bytes actually present (truncated and over-long files are both
// errors), image/label count agreement and the label range. Errors name the file and the fault:
//   NOT_FOUND          the file does not exist
//   DATA_LOSS          bad magic, truncated or over-long contents, a corrupt gzip stream,
//                      image/label count mismatch, a label out of range
//   INVALID_ARGUMENT   bad arguments (e.g. num_classes < 1), or the path is a directory
//
// Fashion-MNIST as packaged by Debian (`apt-get install dataset-fashion-mnist`) lives in
// kFashionMnistDir: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz (60000 images),
// t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (10000 images), 28x28, 10 classes.
//
// Thread-safety: the functions share no state; call them from any thread. ImageDataset is a
// plain value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::data {

// An IDX array of unsigned bytes, as stored.
struct IdxUbyteArray {
  std::vector<int64_t> dims;  // dimension sizes, outermost first
  std::vector<uint8_t> data;  // product(dims) elements, row-major
};

// Reads the IDX file at `path` (gzipped or plain), which must hold unsigned bytes in exactly
// `expected_rank` dimensions (magic 0x00000800 | expected_rank). Rejects arrays of more than
// 2^34 elements (no real IDX file comes close), and reserves at most 256 MiB on the header's word:
// past that, memory grows with the bytes actually read, so a lying header cannot demand a huge
// buffer.
StatusOr<IdxUbyteArray> ReadIdxUbyte(const std::string& path, int expected_rank);

// A labelled image dataset held in memory.
struct ImageDataset {
  int64_t count = 0;  // number of images
  int rows = 0;
  int cols = 0;
  int num_classes = 0;
  std::vector<float> images;   // [count * rows * cols], row-major; pixel byte / 255, in [0, 1]
  std::vector<int32_t> labels;  // [count], each in [0, num_classes)

  int64_t pixels_per_image() const { return int64_t{rows} * cols; }
  std::span<const float> image(int64_t i) const {
    return std::span<const float>(images).subspan(i * pixels_per_image(), pixels_per_image());
  }

  // Copies the images and labels at `indices` (e.g. from EpochIndices), in that order, into
  // `images_out` ([indices.size() * pixels_per_image()]) and `labels_out` ([indices.size()]),
  // replacing their contents. OUT_OF_RANGE if an index is not in [0, count); the outputs are
  // then unspecified.
  Status Gather(std::span<const int64_t> indices, std::vector<float>* images_out,
                std::vector<int32_t>* labels_out) const;
};

// Reads an IDX3 images file and the IDX1 labels file that goes with it. Labels must lie in
// [0, num_classes) and the two counts must agree.
StatusOr<ImageDataset> ReadIdxImageDataset(const std::string& images_path,
                                           const std::string& labels_path, int num_classes);

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionMnistClasses = 10;

enum class FashionMnistSplit { kTrain, kTest };

// "<dir>/train-images-idx3-ubyte.gz" or "<dir>/t10k-images-idx3-ubyte.gz", and the labels twin.
std::string FashionMnistImagesPath(const std::string& dir, FashionMnistSplit split);
std::string FashionMnistLabelsPath(const std::string& dir, FashionMnistSplit split);

// Loads one split of Fashion-MNIST from `dir` (memory: 4 bytes per pixel, ~188 MB for train).
// A missing file is NOT_FOUND with a hint to install the Debian package.
StatusOr<ImageDataset> LoadFashionMnist(FashionMnistSplit split,
                                        const std::string& dir = kFashionMnistDir);

}  // namespace ferry::data
