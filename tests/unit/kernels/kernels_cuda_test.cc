// Every CUDA twin against its CPU reference on random data: fixed seeds (printed, and recorded as
// test properties), a declared tolerance per op, and a guard that the outputs are not all zero.
// Tests that need a GPU skip where there is none; the argument-check tests run everywhere.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ferry/kernels.h"
#include "ferry/kernels_cuda.h"
#include "test_util.h"

namespace ferry::kernels {
namespace {

using ::ferry::kernels::testing::AllClose;
using ::ferry::kernels::testing::NotAllZero;
using ::ferry::kernels::testing::RandomFloats;
using ::ferry::kernels::testing::RandomInts;
using ::ferry::kernels::testing::SeededRng;
using ::ferry::kernels::testing::Tolerance;

#define ASSERT_CUDA_OK(call)                                                        \
  do {                                                                              \
    const cudaError_t assert_cuda_ok_ = (call);                                     \
    ASSERT_EQ(assert_cuda_ok_, cudaSuccess) << #call << ": "                        \
                                            << cudaGetErrorString(assert_cuda_ok_); \
  } while (0)
#define ASSERT_OK(expr)                          \
  do {                                           \
    const ::ferry::Status assert_ok_ = (expr);   \
    ASSERT_TRUE(assert_ok_.ok()) << assert_ok_;  \
  } while (0)

// Device memory owned by the test (the kernels themselves never allocate).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(&ptr_, n_ * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const std::vector<T>& host, cudaStream_t stream) : DeviceBuffer(host.size()) {
    if (n_ > 0) cudaMemcpyAsync(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  T* get() const { return static_cast<T*>(ptr_); }
  // Synchronizes `stream`, then copies the whole buffer back.
  std::vector<T> Download(cudaStream_t stream) const {
    std::vector<T> host(n_);
    if (n_ > 0) cudaMemcpyAsync(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    return host;
  }

 private:
  size_t n_;
  void* ptr_ = nullptr;
};

// A fixture holding a stream and a cuBLAS handle; skips when the machine has no CUDA device.
class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned " << cudaGetErrorName(error)
                   << " with " << count << " devices; the CUDA-vs-CPU checks need a GPU";
    }
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "a kernel failed";
      cudaStreamDestroy(stream_);
    }
  }

  template <typename T>
  DeviceBuffer<T> Upload(const std::vector<T>& host) {
    return DeviceBuffer<T>(host, stream_);
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

// ---- GEMM --------------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, GemmMatchesCpu) {
  // FP32 cuBLAS (default math mode) against OpenBLAS, inner dimension 129, inputs in [-1, 1].
  constexpr Tolerance kTol{1e-4f, 1e-4f};
  const int64_t m = 67, n = 45, k = 129;
  const float alpha = 1.5f, beta = 0.5f;
  uint32_t seed = 1001;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      SCOPED_TRACE("trans_a=" + std::to_string(int(ta)) + " trans_b=" + std::to_string(int(tb)));
      std::mt19937 rng = SeededRng("gemm", seed++);
      // Padded strides (+3) exercise lda/ldb/ldc.
      const int64_t a_rows = ta == Transpose::kNo ? m : k, a_cols = ta == Transpose::kNo ? k : m;
      const int64_t b_rows = tb == Transpose::kNo ? k : n, b_cols = tb == Transpose::kNo ? n : k;
      const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
      const std::vector<float> a = RandomFloats(rng, a_rows * lda, -1, 1);
      const std::vector<float> b = RandomFloats(rng, b_rows * ldb, -1, 1);
      std::vector<float> c = RandomFloats(rng, m * ldc, -1, 1);
      auto da = Upload(a), db = Upload(b), dc = Upload(c);
      ASSERT_OK(cuda::Gemm(blas_, ta, tb, m, n, k, alpha, da.get(), lda, db.get(), ldb, beta,
                           dc.get(), ldc, stream_));
      ASSERT_OK(cpu::Gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
                          ldc));
      const std::vector<float> got = dc.Download(stream_);
      EXPECT_TRUE(AllClose(got, c, kTol));
      EXPECT_TRUE(NotAllZero(got));
    }
  }
}

TEST_F(CudaKernelsTest, GemmEmptyInnerDimension) {
  std::vector<float> c = {1, 2, 3, 4};
  auto dc = Upload(c);
  ASSERT_OK(cuda::Gemm(blas_, Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0f, nullptr, 1, nullptr,
                       2, 3.0f, dc.get(), 2, stream_));
  EXPECT_TRUE(AllClose(dc.Download(stream_), {3, 6, 9, 12}, {0, 0}));
  ASSERT_OK(cuda::Gemm(blas_, Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0f, nullptr, 1, nullptr,
                       2, 0.0f, dc.get(), 2, stream_));
  EXPECT_TRUE(AllClose(dc.Download(stream_), {0, 0, 0, 0}, {0, 0}));
}

// ---- Bias --------------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, BiasAddMatchesCpu) {
  constexpr Tolerance kTol{0.0f, 0.0f};  // One addition per element: exact.
  std::mt19937 rng = SeededRng("bias_add", 2001);
  const int64_t rows = 300, cols = 77;
  std::vector<float> x = RandomFloats(rng, rows * cols, -1, 1);
  const std::vector<float> bias = RandomFloats(rng, cols, -1, 1);
  auto dx = Upload(x), dbias = Upload(bias);
  ASSERT_OK(cuda::BiasAdd(dbias.get(), rows, cols, dx.get(), stream_));
  ASSERT_OK(cpu::BiasAdd(bias.data(), rows, cols, x.data()));
  const std::vector<float> got = dx.Download(stream_);
  EXPECT_TRUE(AllClose(got, x, kTol));
  EXPECT_TRUE(NotAllZero(got));
}

TEST_F(CudaKernelsTest, BiasGradMatchesCpu) {
  // 1000-term column sums in a different order than the CPU's: a few float ulps of the sum.
  constexpr Tolerance kTol{5e-4f, 1e-5f};
  std::mt19937 rng = SeededRng("bias_grad", 2002);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1000, 77}, {5, 1}, {0, 9}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
    const std::vector<float> dy = RandomFloats(rng, rows * cols, -1, 1);
    std::vector<float> want(cols);
    auto ddy = Upload(dy);
    DeviceBuffer<float> ddbias(cols);
    ASSERT_OK(cuda::BiasGrad(ddy.get(), rows, cols, ddbias.get(), stream_));
    ASSERT_OK(cpu::BiasGrad(dy.data(), rows, cols, want.data()));
    const std::vector<float> got = ddbias.Download(stream_);
    EXPECT_TRUE(AllClose(got, want, kTol));
    if (rows > 0) {
      EXPECT_TRUE(NotAllZero(got));
    }
  }
}

// ---- ReLU --------------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, ReluMatchesCpu) {
  constexpr Tolerance kTol{0.0f, 0.0f};  // A select per element: exact.
  std::mt19937 rng = SeededRng("relu", 3001);
  const int64_t n = 100003;
  const std::vector<float> x = RandomFloats(rng, n, -1, 1);
  const std::vector<float> dy = RandomFloats(rng, n, -1, 1);
  std::vector<float> y(n), dx(n);
  auto dev_x = Upload(x), dev_dy = Upload(dy);
  DeviceBuffer<float> dev_y(n), dev_dx(n);
  ASSERT_OK(cuda::ReluForward(dev_x.get(), n, dev_y.get(), stream_));
  ASSERT_OK(cuda::ReluBackward(dev_y.get(), dev_dy.get(), n, dev_dx.get(), stream_));
  ASSERT_OK(cpu::ReluForward(x.data(), n, y.data()));
  ASSERT_OK(cpu::ReluBackward(y.data(), dy.data(), n, dx.data()));
  const std::vector<float> got_y = dev_y.Download(stream_), got_dx = dev_dx.Download(stream_);
  EXPECT_TRUE(AllClose(got_y, y, kTol));
  EXPECT_TRUE(AllClose(got_dx, dx, kTol));
  EXPECT_TRUE(NotAllZero(got_y));
  EXPECT_TRUE(NotAllZero(got_dx));
}

// ---- Softmax cross-entropy ---------------------------------------------------------------------

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyMatchesCpu) {
  // expf/logf (a couple of ulps apart between CUDA and glibc) and a different summation order.
  constexpr Tolerance kProbTol{1e-6f, 1e-5f};
  constexpr Tolerance kLossTol{1e-5f, 1e-5f};
  uint32_t seed = 4001;
  // A warp per row up to 128 classes (one lane's share, several, the last such width), then a
  // block per row (129; 1000: a multi-warp block reduction). 257 rows: the last block of 8 rows
  // holds one.
  for (int64_t classes : {1, 10, 100, 128, 129, 1000}) {
    SCOPED_TRACE("classes=" + std::to_string(classes));
    std::mt19937 rng = SeededRng("softmax_xent", seed++);
    const int64_t rows = 257;
    const std::vector<float> logits = RandomFloats(rng, rows * classes, -8, 8);
    const std::vector<int32_t> labels = RandomInts(rng, rows, 0, int32_t(classes - 1));
    std::vector<float> probs(rows * classes), row_loss(rows), mean(1), dlogits(rows * classes);
    ASSERT_OK(cpu::SoftmaxCrossEntropyForward(logits.data(), labels.data(), rows, classes,
                                              probs.data(), row_loss.data(), mean.data()));
    ASSERT_OK(cpu::SoftmaxCrossEntropyBackward(probs.data(), labels.data(), rows, classes,
                                               1.0f / rows, dlogits.data()));
    auto d_logits = Upload(logits);
    auto d_labels = Upload(labels);
    DeviceBuffer<float> d_probs(rows * classes), d_row_loss(rows), d_mean(1),
        d_dlogits(rows * classes);
    ASSERT_OK(cuda::SoftmaxCrossEntropyForward(d_logits.get(), d_labels.get(), rows, classes,
                                               d_probs.get(), d_row_loss.get(), d_mean.get(),
                                               stream_));
    ASSERT_OK(cuda::SoftmaxCrossEntropyBackward(d_probs.get(), d_labels.get(), rows, classes,
                                                1.0f / rows, d_dlogits.get(), stream_));
    const std::vector<float> got_probs = d_probs.Download(stream_);
    const std::vector<float> got_loss = d_row_loss.Download(stream_);
    const std::vector<float> got_mean = d_mean.Download(stream_);
    const std::vector<float> got_d = d_dlogits.Download(stream_);
    EXPECT_TRUE(AllClose(got_probs, probs, kProbTol));
    EXPECT_TRUE(AllClose(got_loss, row_loss, kLossTol));
    EXPECT_TRUE(AllClose(got_mean, mean, kLossTol));
    EXPECT_TRUE(AllClose(got_d, dlogits, kProbTol));
    EXPECT_TRUE(NotAllZero(got_probs));
    EXPECT_TRUE(NotAllZero(got_d) || classes == 1);  // One class: p = 1, the gradient is 0.
    if (classes > 1) {
      EXPECT_TRUE(NotAllZero(got_loss));
    }
  }
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyBadLabelGivesNan) {
  const std::vector<float> logits = {0, 0, 0, 0};
  const std::vector<int32_t> labels = {1, 5};
  auto d_logits = Upload(logits);
  auto d_labels = Upload(labels);
  DeviceBuffer<float> probs(4), row_loss(2), mean(1);
  ASSERT_OK(cuda::SoftmaxCrossEntropyForward(d_logits.get(), d_labels.get(), 2, 2, probs.get(),
                                             row_loss.get(), mean.get(), stream_));
  const std::vector<float> loss = row_loss.Download(stream_);
  EXPECT_NEAR(loss[0], std::log(2.0f), 1e-6f);
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_TRUE(std::isnan(mean.Download(stream_)[0]));
}

// ---- Sigmoid cross-entropy ---------------------------------------------------------------------

TEST_F(CudaKernelsTest, SigmoidCrossEntropyMatchesCpu) {
  constexpr Tolerance kTol{1e-6f, 1e-5f};
  constexpr Tolerance kMeanTol{1e-5f, 1e-5f};
  std::mt19937 rng = SeededRng("sigmoid_xent", 5001);
  const int64_t n = 10007;
  const std::vector<float> logits = RandomFloats(rng, n, -20, 20);
  const std::vector<float> targets = RandomFloats(rng, n, 0, 1);
  std::vector<float> loss(n), mean(1), probs(n), dlogits(n);
  ASSERT_OK(cpu::SigmoidCrossEntropyForward(logits.data(), targets.data(), n, loss.data(),
                                            mean.data(), probs.data()));
  ASSERT_OK(cpu::SigmoidCrossEntropyBackward(logits.data(), targets.data(), n, 1.0f / n,
                                             dlogits.data()));
  auto d_logits = Upload(logits), d_targets = Upload(targets);
  DeviceBuffer<float> d_loss(n), d_mean(1), d_probs(n), d_dlogits(n);
  ASSERT_OK(cuda::SigmoidCrossEntropyForward(d_logits.get(), d_targets.get(), n, d_loss.get(),
                                             d_mean.get(), d_probs.get(), stream_));
  ASSERT_OK(cuda::SigmoidCrossEntropyBackward(d_logits.get(), d_targets.get(), n, 1.0f / n,
                                              d_dlogits.get(), stream_));
  const std::vector<float> got_loss = d_loss.Download(stream_), got_mean = d_mean.Download(stream_);
  const std::vector<float> got_probs = d_probs.Download(stream_);
  const std::vector<float> got_d = d_dlogits.Download(stream_);
  EXPECT_TRUE(AllClose(got_loss, loss, kTol));
  EXPECT_TRUE(AllClose(got_mean, mean, kMeanTol));
  EXPECT_TRUE(AllClose(got_probs, probs, kTol));
  EXPECT_TRUE(AllClose(got_d, dlogits, {1e-9f, 1e-5f}));
  EXPECT_TRUE(NotAllZero(got_loss));
  EXPECT_TRUE(NotAllZero(got_d));
  // probs is optional.
  ASSERT_OK(cuda::SigmoidCrossEntropyForward(d_logits.get(), d_targets.get(), n, d_loss.get(),
                                             d_mean.get(), nullptr, stream_));
  EXPECT_TRUE(AllClose(d_loss.Download(stream_), loss, kTol));
}

// ---- Embedding bag -----------------------------------------------------------------------------

// Random CSR bags of 0..max_bag positions into num_rows rows.
struct Bags {
  std::vector<int32_t> offsets;
  std::vector<int32_t> indices;
};

Bags RandomBags(std::mt19937& rng, int64_t batch, int32_t max_bag, int64_t num_rows) {
  Bags bags;
  bags.offsets.push_back(0);
  const std::vector<int32_t> sizes = RandomInts(rng, batch, 0, max_bag);
  for (int32_t size : sizes) bags.offsets.push_back(bags.offsets.back() + size);
  bags.indices = RandomInts(rng, bags.offsets.back(), 0, int32_t(num_rows - 1));
  return bags;
}

TEST_F(CudaKernelsTest, EmbeddingBagMatchesCpu) {
  // Both twins sum in ascending position with the same operations; the tolerance only allows for
  // a contraction the compilers may choose.
  constexpr Tolerance kTol{1e-6f, 1e-6f};
  uint32_t seed = 6001;
  for (int64_t dim : {1, 19, 200}) {
    for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
      SCOPED_TRACE("dim=" + std::to_string(dim) + " pooling=" + std::to_string(int(pooling)));
      std::mt19937 rng = SeededRng("embedding_bag", seed++);
      const int64_t batch = 129, num_rows = 300;
      const Bags bags = RandomBags(rng, batch, 8, num_rows);
      const int64_t nnz = bags.offsets.back();
      const std::vector<float> table = RandomFloats(rng, num_rows * dim, -1, 1);
      const std::vector<float> dout = RandomFloats(rng, batch * dim, -1, 1);
      // The backward reads the indices as an inverse map into num_rows "unique" rows, some of
      // which no bag uses (their gradient must be zero).
      std::vector<float> out(batch * dim), grads(num_rows * dim);
      ASSERT_OK(cpu::EmbeddingBagForward(table.data(), num_rows, dim, bags.offsets.data(),
                                         bags.indices.data(), batch, nnz, pooling, out.data()));
      ASSERT_OK(cpu::EmbeddingBagBackward(dout.data(), dim, bags.offsets.data(),
                                          bags.indices.data(), batch, nnz, num_rows, pooling,
                                          grads.data()));

      auto d_table = Upload(table), d_dout = Upload(dout);
      auto d_offsets = Upload(bags.offsets), d_indices = Upload(bags.indices);
      DeviceBuffer<float> d_out(batch * dim), d_grads(num_rows * dim);
      ASSERT_OK(cuda::EmbeddingBagForward(d_table.get(), num_rows, dim, d_offsets.get(),
                                          d_indices.get(), batch, nnz, pooling, d_out.get(),
                                          stream_));
      size_t scratch_bytes = 0;
      ASSERT_OK(cuda::EmbeddingBagBackward(nullptr, &scratch_bytes, nullptr, dim, nullptr,
                                           nullptr, batch, nnz, num_rows, pooling, nullptr,
                                           stream_));
      DeviceBuffer<unsigned char> scratch(scratch_bytes);
      ASSERT_OK(cuda::EmbeddingBagBackward(scratch.get(), &scratch_bytes, d_dout.get(), dim,
                                           d_offsets.get(), d_indices.get(), batch, nnz, num_rows,
                                           pooling, d_grads.get(), stream_));
      const std::vector<float> got_out = d_out.Download(stream_);
      const std::vector<float> got_grads = d_grads.Download(stream_);
      EXPECT_TRUE(AllClose(got_out, out, kTol));
      EXPECT_TRUE(AllClose(got_grads, grads, kTol));
      EXPECT_TRUE(NotAllZero(got_out));
      EXPECT_TRUE(NotAllZero(got_grads));

      // Bitwise reproducible run to run.
      ASSERT_OK(cuda::EmbeddingBagBackward(scratch.get(), &scratch_bytes, d_dout.get(), dim,
                                           d_offsets.get(), d_indices.get(), batch, nnz, num_rows,
                                           pooling, d_grads.get(), stream_));
      EXPECT_EQ(d_grads.Download(stream_), got_grads);
    }
  }
}

TEST_F(CudaKernelsTest, EmbeddingBagBackwardRefusesSmallScratch) {
  size_t scratch_bytes = 0;
  ASSERT_OK(cuda::EmbeddingBagBackward(nullptr, &scratch_bytes, nullptr, 4, nullptr, nullptr, 2,
                                       10, 5, Pooling::kSum, nullptr, stream_));
  ASSERT_GT(scratch_bytes, 0u);
  DeviceBuffer<unsigned char> scratch(scratch_bytes);
  DeviceBuffer<float> dout(8), grads(20);
  DeviceBuffer<int32_t> offsets(3), inverse(10);
  size_t too_small = scratch_bytes - 1;
  const Status s = cuda::EmbeddingBagBackward(scratch.get(), &too_small, dout.get(), 4,
                                              offsets.get(), inverse.get(), 2, 10, 5,
                                              Pooling::kSum, grads.get(), stream_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
}

// ---- Dedup -------------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, DedupMatchesCpuExactly) {
  uint32_t seed = 7001;
  for (int64_t n : {1, 1000, 100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::mt19937 rng = SeededRng("dedup", seed++);
    // Hashed-looking ids from a pool about n/4 large, so ids repeat; both signs.
    std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(1, n / 4));
    std::vector<int64_t> ids(n);
    for (int64_t& id : ids) {
      id = static_cast<int64_t>(pick(rng) * 0x9E3779B97F4A7C15ull);
    }
    std::vector<int64_t> unique(n);
    std::vector<int32_t> inverse(n);
    int32_t u = 0;
    ASSERT_OK(cpu::Dedup(ids.data(), n, unique.data(), inverse.data(), &u));

    auto d_ids = Upload(ids);
    DeviceBuffer<int64_t> d_unique(n);
    DeviceBuffer<int32_t> d_inverse(n), d_u(1);
    size_t scratch_bytes = 0;
    ASSERT_OK(cuda::Dedup(nullptr, &scratch_bytes, nullptr, n, nullptr, nullptr, nullptr,
                          stream_));
    DeviceBuffer<unsigned char> scratch(scratch_bytes);
    ASSERT_OK(cuda::Dedup(scratch.get(), &scratch_bytes, d_ids.get(), n, d_unique.get(),
                          d_inverse.get(), d_u.get(), stream_));
    const int32_t got_u = d_u.Download(stream_)[0];
    ASSERT_EQ(got_u, u);
    std::vector<int64_t> got_unique = d_unique.Download(stream_);
    got_unique.resize(u);
    unique.resize(u);
    EXPECT_EQ(got_unique, unique);
    EXPECT_EQ(d_inverse.Download(stream_), inverse);
    EXPECT_GT(u, 0);
  }
}

TEST_F(CudaKernelsTest, DedupEmpty) {
  auto d_u = Upload(std::vector<int32_t>{-1});  // Must become 0.
  size_t scratch_bytes = 0;
  ASSERT_OK(cuda::Dedup(nullptr, &scratch_bytes, nullptr, 0, nullptr, nullptr, nullptr, stream_));
  DeviceBuffer<unsigned char> scratch(scratch_bytes);
  ASSERT_OK(cuda::Dedup(scratch.get(), &scratch_bytes, nullptr, 0, nullptr, nullptr, d_u.get(),
                        stream_));
  EXPECT_EQ(d_u.Download(stream_)[0], 0);
}

// ---- Argument checks: no device needed ---------------------------------------------------------

// A stand-in for device pointers the checks never dereference.
template <typename T>
T* Fake() {
  return reinterpret_cast<T*>(uintptr_t{0x1000});
}

TEST(CudaKernelsArguments, DeviceCountWorksWithoutADevice) {
  const StatusOr<int> count = cuda::DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  std::cout << "[   INFO   ] CUDA devices: " << *count << std::endl;
  EXPECT_GE(*count, 0);
}

TEST(CudaKernelsArguments, ShapeMistakesGiveTheCpuTwinsStatus) {
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(uintptr_t{0x2000});
  float* f = Fake<float>();
  int32_t* i = Fake<int32_t>();
  EXPECT_EQ(cuda::Gemm(nullptr, Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.0f, f, 2, f, 2, 0.0f,
                       f, 2, stream),
            cpu::Gemm(Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.0f, f, 2, f, 2, 0.0f, f, 2));
  EXPECT_EQ(cuda::BiasAdd(nullptr, 2, 3, f, stream), cpu::BiasAdd(nullptr, 2, 3, f));
  EXPECT_EQ(cuda::ReluForward(f, -1, f, stream), cpu::ReluForward(f, -1, f));
  EXPECT_EQ(cuda::SoftmaxCrossEntropyForward(f, i, 2, 0, f, f, f, stream),
            cpu::SoftmaxCrossEntropyForward(f, i, 2, 0, f, f, f));
  EXPECT_EQ(cuda::SigmoidCrossEntropyForward(f, nullptr, 2, f, f, nullptr, stream),
            cpu::SigmoidCrossEntropyForward(f, nullptr, 2, f, f, nullptr));
  EXPECT_EQ(cuda::EmbeddingBagForward(f, 4, 2, i, i, 3, 5, static_cast<Pooling>(9), f, stream),
            cpu::EmbeddingBagForward(f, 4, 2, i, i, 3, 5, static_cast<Pooling>(9), f));
  size_t bytes = 1 << 20;
  EXPECT_EQ(cuda::EmbeddingBagBackward(f, &bytes, nullptr, 2, i, i, 3, 5, 4, Pooling::kSum, f,
                                       stream),
            cpu::EmbeddingBagBackward(nullptr, 2, i, i, 3, 5, 4, Pooling::kSum, f));
  int64_t* ids = Fake<int64_t>();
  EXPECT_EQ(cuda::Dedup(f, &bytes, ids, 4, ids, i, nullptr, stream),
            cpu::Dedup(ids, 4, ids, i, nullptr));
  // And each of those is a refusal.
  EXPECT_EQ(cuda::ReluForward(f, -1, f, stream).code(), StatusCode::kInvalidArgument);
}

TEST(CudaKernelsArguments, NullStreamIsRefused) {
  float* f = Fake<float>();
  const Status s = cuda::ReluForward(f, 4, f, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("stream"), std::string::npos) << s;
  EXPECT_EQ(cuda::BiasGrad(f, 2, 2, f, nullptr).code(), StatusCode::kInvalidArgument);
  size_t bytes = 1 << 20;
  EXPECT_EQ(cuda::Dedup(f, &bytes, Fake<int64_t>(), 4, Fake<int64_t>(), Fake<int32_t>(),
                        Fake<int32_t>(), nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::Dedup(nullptr, nullptr, nullptr, 4, nullptr, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);  // scratch_bytes is required.
}

}  // namespace
}  // namespace ferry::kernels
