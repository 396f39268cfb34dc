#include "ferry/data/fashion_mnist.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>

#include "gz_file.h"

namespace ferry::data {
namespace {

// Largest array ReadIdxUbyte accepts: Fashion-MNIST train is 47 MB, the largest IDX files in use
// are a few GB.
constexpr int64_t kMaxIdxElements = int64_t{1} << 34;
// Data is read (and the buffer grown) this many bytes at a time.
constexpr int64_t kReadChunk = int64_t{4} << 20;
// Capacity reserved up front from the header's claim (address space only: pages are touched as
// data arrives); beyond it the buffer grows with the data.
constexpr int64_t kMaxReserve = int64_t{256} << 20;

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

StatusOr<IdxUbyteArray> ReadIdxUbyte(const std::string& path, int expected_rank) {
  if (expected_rank < 1 || expected_rank > 255) {
    return InvalidArgumentError("ReadIdxUbyte(" + path + "): rank " + std::to_string(expected_rank) +
                                " is not in [1, 255]");
  }
  FERRY_ASSIGN_OR_RETURN(internal::GzFile file, internal::GzFile::Open(path));

  std::array<unsigned char, 4> magic_bytes;
  FERRY_ASSIGN_OR_RETURN(int64_t got, file.Read(magic_bytes.data(), 4));
  if (got < 4) {
    return DataLossError(path + ": truncated IDX header: " + std::to_string(got) +
                         " bytes, the magic number alone needs 4");
  }
  const uint32_t magic = BigEndian32(magic_bytes.data());
  const uint32_t expected_magic = 0x800u | static_cast<uint32_t>(expected_rank);
  if (magic != expected_magic) {
    std::string what = path + ": bad IDX magic " + Hex32(magic) + ", expected " + Hex32(expected_magic) +
                       " (unsigned bytes, " + std::to_string(expected_rank) + " dimensions)";
    if ((magic & 0xffffff00u) == 0x800u) {
      what += "; the file holds unsigned bytes in " + std::to_string(magic & 0xffu) + " dimensions";
    } else if (magic_bytes[0] == 0x1f && magic_bytes[1] == 0x8b) {
      what += "; it looks like a gzip stream inside the gzip stream";
    }
    return DataLossError(std::move(what));
  }

  std::vector<unsigned char> dim_bytes(4 * static_cast<size_t>(expected_rank));
  FERRY_ASSIGN_OR_RETURN(got, file.Read(dim_bytes.data(), static_cast<int64_t>(dim_bytes.size())));
  if (got < static_cast<int64_t>(dim_bytes.size())) {
    return DataLossError(path + ": truncated IDX header: " + std::to_string(expected_rank) +
                         " dimension sizes need " + std::to_string(dim_bytes.size()) + " bytes, found " +
                         std::to_string(got));
  }
  IdxUbyteArray array;
  int64_t elements = 1;
  for (int d = 0; d < expected_rank; ++d) {
    const int64_t size = BigEndian32(dim_bytes.data() + 4 * d);
    array.dims.push_back(size);
    // Checked before multiplying, so the product never overflows: elements * size > limit
    // exactly when elements > limit / size (integer division, size > 0).
    if (size != 0 && elements > kMaxIdxElements / size) {
      return DataLossError(path + ": IDX dimensions " + DimsString(array.dims) + "... exceed the limit of " +
                           std::to_string(kMaxIdxElements) + " elements");
    }
    elements *= size;
  }

  // Grow with the data actually present, so a lying header cannot make us allocate its claim.
  array.data.reserve(static_cast<size_t>(std::min(elements, kMaxReserve)));
  while (static_cast<int64_t>(array.data.size()) < elements) {
    const int64_t have = static_cast<int64_t>(array.data.size());
    const int64_t want = std::min(elements - have, kReadChunk);
    array.data.resize(static_cast<size_t>(have + want));
    FERRY_ASSIGN_OR_RETURN(got, file.Read(array.data.data() + have, want));
    if (got < want) {
      return DataLossError(path + ": truncated IDX data: dimensions " + DimsString(array.dims) + " need " +
                           std::to_string(elements) + " bytes after the header, the file has " +
                           std::to_string(have + got));
    }
  }
  unsigned char extra;
  FERRY_ASSIGN_OR_RETURN(got, file.Read(&extra, 1));
  if (got != 0) {
    return DataLossError(path + ": over-long IDX file: bytes follow the " + std::to_string(elements) +
                         " bytes that dimensions " + DimsString(array.dims) + " declare");
  }
  return array;
}

Status ImageDataset::Gather(std::span<const int64_t> indices, std::vector<float>* images_out,
                            std::vector<int32_t>* labels_out) const {
  const int64_t pixels = pixels_per_image();
  images_out->resize(indices.size() * static_cast<size_t>(pixels));
  labels_out->resize(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    if (i < 0 || i >= count) {
      return OutOfRangeError("ImageDataset::Gather: index " + std::to_string(i) + " at position " +
                             std::to_string(k) + " is not in [0, " + std::to_string(count) + ")");
    }
    std::copy_n(images.begin() + i * pixels, pixels, images_out->begin() + static_cast<int64_t>(k) * pixels);
    (*labels_out)[k] = labels[static_cast<size_t>(i)];
  }
  return Status::Ok();
}

StatusOr<ImageDataset> ReadIdxImageDataset(const std::string& images_path, const std::string& labels_path,
                                           int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgumentError("ReadIdxImageDataset: num_classes " + std::to_string(num_classes) +
                                " is not in [1, 256]");
  }
  FERRY_ASSIGN_OR_RETURN(IdxUbyteArray images, ReadIdxUbyte(images_path, 3));
  FERRY_ASSIGN_OR_RETURN(IdxUbyteArray labels, ReadIdxUbyte(labels_path, 1));
  if (images.dims[1] < 1 || images.dims[2] < 1) {
    return DataLossError(images_path + ": images of " + std::to_string(images.dims[1]) + "x" +
                         std::to_string(images.dims[2]) + " pixels; rows and columns must be >= 1");
  }
  if (images.dims[0] != labels.dims[0]) {
    return DataLossError("image/label count mismatch: " + images_path + " holds " + std::to_string(images.dims[0]) +
                         " images, " + labels_path + " holds " + std::to_string(labels.dims[0]) + " labels");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes) {
      return DataLossError(labels_path + ": label " + std::to_string(labels.data[i]) + " of example " +
                           std::to_string(i) + " is not in [0, " + std::to_string(num_classes) + ")");
    }
  }

  ImageDataset out;
  out.count = images.dims[0];
  out.rows = static_cast<int>(images.dims[1]);
  out.cols = static_cast<int>(images.dims[2]);
  out.num_classes = num_classes;
  out.labels.assign(labels.data.begin(), labels.data.end());
  std::vector<uint8_t>().swap(labels.data);
  out.images.resize(images.data.size());
  std::transform(images.data.begin(), images.data.end(), out.images.begin(),
                 [](uint8_t v) { return static_cast<float>(v) / 255.0f; });
  return out;
}

std::string FashionMnistImagesPath(const std::string& dir, FashionMnistSplit split) {
  return dir + (split == FashionMnistSplit::kTrain ? "/train" : "/t10k") + "-images-idx3-ubyte.gz";
}

std::string FashionMnistLabelsPath(const std::string& dir, FashionMnistSplit split) {
  return dir + (split == FashionMnistSplit::kTrain ? "/train" : "/t10k") + "-labels-idx1-ubyte.gz";
}

StatusOr<ImageDataset> LoadFashionMnist(FashionMnistSplit split, const std::string& dir) {
  StatusOr<ImageDataset> data = ReadIdxImageDataset(FashionMnistImagesPath(dir, split),
                                                    FashionMnistLabelsPath(dir, split), kFashionMnistClasses);
  if (data.status().code() == StatusCode::kNotFound) {
    return NotFoundError(data.status().message() +
                         " (Fashion-MNIST: install the Debian package dataset-fashion-mnist)");
  }
  return data;
}

}  // namespace ferry::data
