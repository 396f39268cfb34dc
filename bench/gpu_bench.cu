// ferry-gpu-bench: the CUDA half against the GPU's own limits, in one run (issue 31).
//
// The limits are measured here, not taken from a datasheet: the memory bandwidth is a large
// device-to-device copy (bytes read + bytes written), the matrix rate is cuBLAS's SGEMM at
// 8192^3 (and its TF32 mode, for context), the host link is a pinned 256 MiB copy each way. Each
// kernel is timed with CUDA events (median of the repetitions, after warm-up) at sizes that
// overflow the L2 cache, and reported as a ratio to its limit:
//   - memory-bound ops: the fewest bytes the op must move (each input read once, each output
//     written once) over its time, against the copy's bandwidth;
//   - Dedup: ids/s, against CUB's radix sort of the same (id, position) pairs alone (the sort is
//     this design's floor) and against the bandwidth;
//   - GEMMs: the models' own shapes through ferry::kernels::cuda::Gemm, in TFLOP/s against the
//     SGEMM peak; the small ones are launch-bound, so their time per call is printed too;
//   - host<->device copies: pinned against pageable memory at 64 KiB to 256 MiB.
// Inputs are random (never zeros); outputs are poisoned with NaN first and checked to be written.
//
// Usage: ferry-gpu-bench [--quick] [--json FILE]. Prints a table; --json writes one object per row.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/kernels.h"
#include "ferry/kernels_cuda.h"

namespace {

namespace kc = ferry::kernels::cuda;
using ferry::kernels::Pooling;
using ferry::kernels::Transpose;

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(e_));                                                       \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define CHECK_CUBLAS(call)                                                                        \
  do {                                                                                            \
    const cublasStatus_t s_ = (call);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                  \
                   cublasGetStatusString(s_));                                                    \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define CHECK_OK(expr)                                                                            \
  do {                                                                                            \
    const ferry::Status st_ = (expr);                                                             \
    if (!st_.ok()) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, st_.ToString().c_str());          \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Row {
  std::string group, name;
  double ms = 0;        // median time of one call
  double amount = 0;    // bytes, flops or ids per call
  std::string unit;     // "GB/s", "TFLOP/s", "Gid/s"
  double rate = 0;      // amount / time, in unit
  double limit = 0;     // the limit in the same unit (0: none)
  std::string limit_name;
};

std::vector<Row> g_rows;
bool g_quick = false;

void Add(Row r) {
  std::printf("%-10s %-58s %10.4f ms %10.2f %-8s", r.group.c_str(), r.name.c_str(), r.ms, r.rate,
              r.unit.c_str());
  if (r.limit > 0) std::printf(" %6.3f of %s", r.rate / r.limit, r.limit_name.c_str());
  std::printf("\n");
  std::fflush(stdout);
  g_rows.push_back(std::move(r));
}

// Median milliseconds of `reps` calls of f (each between two events), after `warm` calls.
template <typename F>
double MedianMs(cudaStream_t stream, F&& f, int reps = 20, int warm = 3) {
  if (g_quick) reps = std::min(reps, 5);
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) f();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    f();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d = DeviceAlloc<T>(v.size());
  CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Poisons a float output with NaN (0xFF bytes) before the checked call, on the call's stream (a
// non-blocking stream does not wait for the legacy default stream's cudaMemset).
void Poison(float* d, size_t n, cudaStream_t s) {
  CHECK_CUDA(cudaMemsetAsync(d, 0xFF, n * sizeof(float), s));
  CHECK_CUDA(cudaStreamSynchronize(s));
}

// Every element of the device output is finite (the call wrote all of it).
void ExpectWritten(const char* what, const float* d, size_t n) {
  std::vector<float> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (float x : h) bad += std::isfinite(x) ? 0 : 1;
  if (bad != 0) {
    std::fprintf(stderr, "%s: %zu of %zu outputs not written (or not finite)\n", what, bad, n);
    std::exit(1);
  }
}

double Gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

struct Limits {
  double bandwidth = 0;  // GB/s, device-to-device copy (read + write)
  double sgemm = 0;      // TFLOP/s, cuBLAS SGEMM 8192^3, default math
  double h2d = 0, d2h = 0;  // GB/s, pinned 256 MiB
};

Limits MeasureLimits(cudaStream_t s, cublasHandle_t blas) {
  Limits l;
  const size_t bytes = size_t{1} << 30;
  char* a = DeviceAlloc<char>(bytes);
  char* b = DeviceAlloc<char>(bytes);
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  const double copy_ms =
      MedianMs(s, [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
  l.bandwidth = Gbps(2.0 * bytes, copy_ms);
  Add({"limit", "device-to-device copy 1 GiB (read + write)", copy_ms, 2.0 * bytes, "GB/s",
       l.bandwidth, 0, ""});
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));

  const int n = g_quick ? 4096 : 8192;
  const std::vector<float> host = RandomFloats(size_t{1} * n * n, 1);
  float* x = Upload(host);
  float* y = Upload(host);
  float* z = DeviceAlloc<float>(size_t{1} * n * n);
  const float one = 1.0f, zero = 0.0f;
  CHECK_CUBLAS(cublasSetStream(blas, s));
  const double flops = 2.0 * n * n * n;
  const double fp32_ms = MedianMs(
      s,
      [&] {
        CHECK_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, n, y, n, &zero, z, n));
      },
      10, 2);
  l.sgemm = flops / (fp32_ms * 1e-3) / 1e12;
  Add({"limit", "cuBLAS SGEMM " + std::to_string(n) + "^3 (FP32, default math)", fp32_ms, flops,
       "TFLOP/s", l.sgemm, 0, ""});
  CHECK_CUBLAS(cublasSetMathMode(blas, CUBLAS_TF32_TENSOR_OP_MATH));
  const double tf32_ms = MedianMs(
      s,
      [&] {
        CHECK_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, n, y, n, &zero, z, n));
      },
      10, 2);
  CHECK_CUBLAS(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
  Add({"limit", "cuBLAS SGEMM " + std::to_string(n) + "^3 (TF32 tensor cores; Ferry does not use it)",
       tf32_ms, flops, "TFLOP/s", flops / (tf32_ms * 1e-3) / 1e12, l.sgemm, "SGEMM FP32"});
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
  CHECK_CUDA(cudaFree(z));
  return l;
}

void Copies(cudaStream_t s, Limits* l) {
  const size_t max_bytes = size_t{256} << 20;
  char* dev = DeviceAlloc<char>(max_bytes);
  char* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned), max_bytes));
  std::vector<char> pageable(max_bytes, 3);
  std::memset(pinned, 3, max_bytes);
  // The pinned 256 MiB copies first: they are the link's limit for the rest.
  for (const bool to_device : {true, false}) {
    const double ms = MedianMs(s, [&] {
      CHECK_CUDA(to_device ? cudaMemcpyAsync(dev, pinned, max_bytes, cudaMemcpyHostToDevice, s)
                           : cudaMemcpyAsync(pinned, dev, max_bytes, cudaMemcpyDeviceToHost, s));
    });
    (to_device ? l->h2d : l->d2h) = Gbps(max_bytes, ms);
  }
  for (const size_t bytes : {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, max_bytes}) {
    for (const bool to_device : {true, false}) {
      for (const bool pin : {true, false}) {
        char* host = pin ? pinned : pageable.data();
        const double ms = MedianMs(s, [&] {
          CHECK_CUDA(to_device ? cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s)
                               : cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
        });
        char name[96];
        std::snprintf(name, sizeof(name), "%s %s %zu KiB", to_device ? "host->device" : "device->host",
                      pin ? "pinned  " : "pageable", bytes >> 10);
        Add({"copy", name, ms, double(bytes), "GB/s", Gbps(bytes, ms), to_device ? l->h2d : l->d2h,
             to_device ? "pinned 256 MiB h2d" : "pinned 256 MiB d2h"});
      }
    }
  }
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(dev));
}

void EmbeddingBags(cudaStream_t s, const Limits& l) {
  const int64_t batch = g_quick ? 16384 : 65536, pool = 32, nnz = batch * pool;
  const int64_t rows = int64_t{1} << 22;  // 4M rows: 256 MiB at dim 16, 1 GiB at dim 64
  std::mt19937_64 rng(7);
  std::vector<int32_t> offsets(batch + 1), indices(nnz);
  for (int64_t b = 0; b <= batch; ++b) offsets[b] = static_cast<int32_t>(b * pool);
  std::uniform_int_distribution<int32_t> any_row(0, static_cast<int32_t>(rows - 1));
  for (int32_t& i : indices) i = any_row(rng);
  int32_t* d_offsets = Upload(offsets);
  int32_t* d_indices = Upload(indices);
  // The backward's inverse map: positions of the batch's unique rows (u of them), as after Dedup.
  const int64_t unique = nnz / 4;
  std::uniform_int_distribution<int32_t> any_unique(0, static_cast<int32_t>(unique - 1));
  std::vector<int32_t> inverse(nnz);
  for (int32_t& i : inverse) i = any_unique(rng);
  int32_t* d_inverse = Upload(inverse);
  for (const int64_t dim : {int64_t{16}, int64_t{64}}) {
    float* table = Upload(RandomFloats(size_t(rows * dim), 11));
    float* out = DeviceAlloc<float>(size_t(batch * dim));
    for (const Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
      const char* pname = pooling == Pooling::kSum ? "sum" : "mean";
      Poison(out, size_t(batch * dim), s);
      CHECK_OK(kc::EmbeddingBagForward(table, rows, dim, d_offsets, d_indices, batch, nnz, pooling, out, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
      ExpectWritten("EmbeddingBagForward", out, size_t(batch * dim));
      const double ms = MedianMs(s, [&] {
        CHECK_OK(kc::EmbeddingBagForward(table, rows, dim, d_offsets, d_indices, batch, nnz, pooling, out, s));
      });
      const double bytes = 4.0 * (nnz * dim + nnz + batch + 1 + batch * dim);
      char name[128];
      std::snprintf(name, sizeof(name), "EmbeddingBagForward %s dim %lld, %lld bags x %lld, 4M rows", pname,
                    (long long)dim, (long long)batch, (long long)pool);
      Add({"kernel", name, ms, bytes, "GB/s", Gbps(bytes, ms), l.bandwidth, "copy bandwidth"});
    }
    // Backward: dout [batch, dim] -> grads [unique, dim].
    float* dout = Upload(RandomFloats(size_t(batch * dim), 13));
    float* grads = DeviceAlloc<float>(size_t(unique * dim));
    size_t scratch_bytes = 0;
    CHECK_OK(kc::EmbeddingBagBackward(nullptr, &scratch_bytes, dout, dim, d_offsets, d_inverse, batch, nnz, unique,
                                      Pooling::kSum, grads, s));
    void* scratch = DeviceAlloc<char>(scratch_bytes);
    Poison(grads, size_t(unique * dim), s);
    CHECK_OK(kc::EmbeddingBagBackward(scratch, &scratch_bytes, dout, dim, d_offsets, d_inverse, batch, nnz, unique,
                                      Pooling::kSum, grads, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    ExpectWritten("EmbeddingBagBackward", grads, size_t(unique * dim));
    const double ms = MedianMs(s, [&] {
      CHECK_OK(kc::EmbeddingBagBackward(scratch, &scratch_bytes, dout, dim, d_offsets, d_inverse, batch, nnz, unique,
                                        Pooling::kSum, grads, s));
    });
    // The fewest bytes: inverse and offsets, dout once, grads once.
    const double bytes = 4.0 * (nnz + batch + 1 + batch * dim + unique * dim);
    char name[128];
    std::snprintf(name, sizeof(name), "EmbeddingBagBackward sum dim %lld, %lld positions -> %lld rows",
                  (long long)dim, (long long)nnz, (long long)unique);
    Add({"kernel", name, ms, bytes, "GB/s", Gbps(bytes, ms), l.bandwidth, "copy bandwidth"});
    CHECK_CUDA(cudaFree(scratch));
    CHECK_CUDA(cudaFree(grads));
    CHECK_CUDA(cudaFree(dout));
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(table));
  }
  CHECK_CUDA(cudaFree(d_inverse));
  CHECK_CUDA(cudaFree(d_indices));
  CHECK_CUDA(cudaFree(d_offsets));
}

void Dedups(cudaStream_t s, const Limits& l) {
  for (const int64_t n : {int64_t{1} << 16, int64_t{1} << 22}) {
    // Zipf-like ids (s ~ 1.1 by inverse transform), scattered over 64 bits by a hash.
    std::mt19937_64 rng(21);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int64_t> ids(n);
    for (int64_t& id : ids) {
      const double rank = std::floor(std::pow(1.0 - u(rng), -1.0 / 0.1));  // heavy tail
      uint64_t z = static_cast<uint64_t>(std::min(rank, 1e15)) * 0x9e3779b97f4a7c15ull;
      id = static_cast<int64_t>(z ^ (z >> 29));
    }
    int64_t* d_ids = Upload(ids);
    int64_t* unique = DeviceAlloc<int64_t>(n);
    int32_t* inverse = DeviceAlloc<int32_t>(n);
    int32_t* count = DeviceAlloc<int32_t>(1);
    size_t scratch_bytes = 0;
    CHECK_OK(kc::Dedup(nullptr, &scratch_bytes, d_ids, n, unique, inverse, count, s));
    void* scratch = DeviceAlloc<char>(scratch_bytes);
    const double ms =
        MedianMs(s, [&] { CHECK_OK(kc::Dedup(scratch, &scratch_bytes, d_ids, n, unique, inverse, count, s)); });
    int32_t u_count = 0;
    CHECK_CUDA(cudaMemcpy(&u_count, count, sizeof(int32_t), cudaMemcpyDeviceToHost));
    // CUB's radix sort of the same (id, position) pairs alone: the floor of a sort-based dedup.
    int64_t* sorted = DeviceAlloc<int64_t>(n);
    int32_t* positions = DeviceAlloc<int32_t>(n);
    int32_t* sorted_positions = DeviceAlloc<int32_t>(n);
    std::vector<int32_t> iota(n);
    for (int64_t i = 0; i < n; ++i) iota[i] = static_cast<int32_t>(i);
    CHECK_CUDA(cudaMemcpy(positions, iota.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
    size_t sort_bytes = 0;
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, d_ids, sorted, positions, sorted_positions,
                                               static_cast<int>(n), 0, 64, s));
    void* sort_scratch = DeviceAlloc<char>(sort_bytes);
    const double sort_ms = MedianMs(s, [&] {
      CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, d_ids, sorted, positions,
                                                 sorted_positions, static_cast<int>(n), 0, 64, s));
    });
    const double ids_per_s = n / (ms * 1e-3) / 1e9;
    char name[128];
    std::snprintf(name, sizeof(name), "Dedup %lld Zipf ids (%d distinct)", (long long)n, u_count);
    Add({"kernel", name, ms, double(n), "Gid/s", ids_per_s, n / (sort_ms * 1e-3) / 1e9, "CUB sort of the pairs"});
    const double bytes = 8.0 * n + 4.0 * n + 8.0 * u_count + 4;  // ids in; inverse, unique ids out
    std::snprintf(name, sizeof(name), "Dedup %lld ids, fewest bytes over time", (long long)n);
    Add({"kernel", name, ms, bytes, "GB/s", Gbps(bytes, ms), l.bandwidth, "copy bandwidth"});
    for (void* p : {static_cast<void*>(sort_scratch), static_cast<void*>(sorted_positions),
                    static_cast<void*>(positions), static_cast<void*>(sorted), scratch, static_cast<void*>(count),
                    static_cast<void*>(inverse), static_cast<void*>(unique), static_cast<void*>(d_ids)}) {
      CHECK_CUDA(cudaFree(p));
    }
  }
}

void Losses(cudaStream_t s, const Limits& l) {
  struct Shape {
    int64_t rows, classes;
  };
  for (const Shape sh : {Shape{int64_t{1} << 22, 10}, Shape{65536, 1000}}) {
    const int64_t n = sh.rows * sh.classes;
    float* logits = Upload(RandomFloats(size_t(n), 31, -4, 4));
    std::vector<int32_t> labels(sh.rows);
    std::mt19937_64 rng(5);
    for (int32_t& y : labels) y = static_cast<int32_t>(rng() % sh.classes);
    int32_t* d_labels = Upload(labels);
    float* probs = DeviceAlloc<float>(n);
    float* row_loss = DeviceAlloc<float>(sh.rows);
    float* mean = DeviceAlloc<float>(1);
    float* dlogits = DeviceAlloc<float>(n);
    Poison(probs, n, s);
    Poison(row_loss, sh.rows, s);
    CHECK_OK(kc::SoftmaxCrossEntropyForward(logits, d_labels, sh.rows, sh.classes, probs, row_loss, mean, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    ExpectWritten("SoftmaxCrossEntropyForward probs", probs, n);
    ExpectWritten("SoftmaxCrossEntropyForward loss", row_loss, sh.rows);
    double ms = MedianMs(s, [&] {
      CHECK_OK(kc::SoftmaxCrossEntropyForward(logits, d_labels, sh.rows, sh.classes, probs, row_loss, mean, s));
    });
    char name[128];
    std::snprintf(name, sizeof(name), "SoftmaxCrossEntropyForward %lld x %lld", (long long)sh.rows,
                  (long long)sh.classes);
    double bytes = 4.0 * (2 * n + 2 * sh.rows + 1);
    Add({"kernel", name, ms, bytes, "GB/s", Gbps(bytes, ms), l.bandwidth, "copy bandwidth"});
    ms = MedianMs(s, [&] {
      CHECK_OK(kc::SoftmaxCrossEntropyBackward(probs, d_labels, sh.rows, sh.classes, 1.0f / sh.rows, dlogits, s));
    });
    std::snprintf(name, sizeof(name), "SoftmaxCrossEntropyBackward %lld x %lld", (long long)sh.rows,
                  (long long)sh.classes);
    bytes = 4.0 * (2 * n + sh.rows);
    Add({"kernel", name, ms, bytes, "GB/s", Gbps(bytes, ms), l.bandwidth, "copy bandwidth"});
    for (void* p : {static_cast<void*>(logits), static_cast<void*>(d_labels), static_cast<void*>(probs),
                    static_cast<void*>(row_loss), static_cast<void*>(mean), static_cast<void*>(dlogits)}) {
      CHECK_CUDA(cudaFree(p));
    }
  }
  // Sigmoid binary cross-entropy (the ctr model's loss) over 16M logits.
  const int64_t n = int64_t{1} << 24;
  float* logits = Upload(RandomFloats(size_t(n), 41, -4, 4));
  std::vector<float> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<float>(i % 3 == 0);
  float* d_targets = Upload(targets);
  float* loss = DeviceAlloc<float>(n);
  float* probs = DeviceAlloc<float>(n);
  float* mean = DeviceAlloc<float>(1);
  float* dlogits = DeviceAlloc<float>(n);
  double ms = MedianMs(s, [&] {
    CHECK_OK(kc::SigmoidCrossEntropyForward(logits, d_targets, n, loss, mean, probs, s));
  });
  Add({"kernel", "SigmoidCrossEntropyForward 16M", ms, 16.0 * n, "GB/s", Gbps(16.0 * n, ms), l.bandwidth,
       "copy bandwidth"});
  ms = MedianMs(s, [&] {
    CHECK_OK(kc::SigmoidCrossEntropyBackward(logits, d_targets, n, 1.0f / n, dlogits, s));
  });
  Add({"kernel", "SigmoidCrossEntropyBackward 16M", ms, 12.0 * n, "GB/s", Gbps(12.0 * n, ms), l.bandwidth,
       "copy bandwidth"});
  for (void* p : {static_cast<void*>(logits), static_cast<void*>(d_targets), static_cast<void*>(loss),
                  static_cast<void*>(probs), static_cast<void*>(mean), static_cast<void*>(dlogits)}) {
    CHECK_CUDA(cudaFree(p));
  }
}

void Elementwise(cudaStream_t s, const Limits& l) {
  const int64_t rows = int64_t{1} << 20, cols = 256, n = rows * cols;  // 1 GiB
  float* x = Upload(RandomFloats(size_t(n), 51));
  float* y = DeviceAlloc<float>(n);
  float* dx = DeviceAlloc<float>(n);
  float* bias = Upload(RandomFloats(size_t(cols), 52));
  float* dbias = DeviceAlloc<float>(cols);
  double ms = MedianMs(s, [&] { CHECK_OK(kc::BiasAdd(bias, rows, cols, x, s)); });
  Add({"kernel", "BiasAdd 1M x 256 (in place)", ms, 8.0 * n, "GB/s", Gbps(8.0 * n, ms), l.bandwidth,
       "copy bandwidth"});
  ms = MedianMs(s, [&] { CHECK_OK(kc::BiasGrad(x, rows, cols, dbias, s)); });
  Add({"kernel", "BiasGrad 1M x 256", ms, 4.0 * n, "GB/s", Gbps(4.0 * n, ms), l.bandwidth, "copy bandwidth"});
  ms = MedianMs(s, [&] { CHECK_OK(kc::ReluForward(x, n, y, s)); });
  Add({"kernel", "ReluForward 256M", ms, 8.0 * n, "GB/s", Gbps(8.0 * n, ms), l.bandwidth, "copy bandwidth"});
  ms = MedianMs(s, [&] { CHECK_OK(kc::ReluBackward(y, x, n, dx, s)); });
  Add({"kernel", "ReluBackward 256M", ms, 12.0 * n, "GB/s", Gbps(12.0 * n, ms), l.bandwidth, "copy bandwidth"});
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(dx), static_cast<void*>(bias),
                  static_cast<void*>(dbias)}) {
    CHECK_CUDA(cudaFree(p));
  }
}

// The models' GEMMs: each layer's forward Y = X W, and backward dW = X^T dY and dX = dY W^T.
void Gemms(cudaStream_t s, cublasHandle_t blas, const Limits& l) {
  struct Model {
    const char* name;
    std::vector<int64_t> widths;
  };
  const Model models[] = {{"mlp 784-256-128-10", {784, 256, 128, 10}}, {"ctr 132-256-128-1", {132, 256, 128, 1}}};
  const int64_t max = 8192 * 1024;
  float* a = Upload(RandomFloats(size_t(max), 61));
  float* b = Upload(RandomFloats(size_t(max), 62));
  float* c = DeviceAlloc<float>(max);
  for (const Model& m : models) {
    for (const int64_t batch : {int64_t{64}, int64_t{4096}}) {
      double total_ms = 0, total_flops = 0;
      for (size_t i = 0; i + 1 < m.widths.size(); ++i) {
        const int64_t in = m.widths[i], out = m.widths[i + 1];
        struct Call {
          const char* what;
          Transpose ta, tb;
          int64_t mm, nn, kk;
        };
        const Call calls[] = {{"Y=XW", Transpose::kNo, Transpose::kNo, batch, out, in},
                              {"dW=X'dY", Transpose::kYes, Transpose::kNo, in, out, batch},
                              {"dX=dYW'", Transpose::kNo, Transpose::kYes, batch, in, out}};
        for (const Call& call : calls) {
          if (i == 0 && call.what[1] == 'X') continue;  // no dX for the input layer
          const int64_t lda = call.ta == Transpose::kNo ? call.kk : call.mm;
          const int64_t ldb = call.tb == Transpose::kNo ? call.nn : call.kk;
          const double ms = MedianMs(s, [&] {
            CHECK_OK(kc::Gemm(blas, call.ta, call.tb, call.mm, call.nn, call.kk, 1.0f, a, lda, b, ldb, 0.0f, c,
                              call.nn, s));
          }, 50, 5);
          const double flops = 2.0 * call.mm * call.nn * call.kk;
          total_ms += ms;
          total_flops += flops;
          if (batch != 4096) continue;  // batch 64: the step's sum only
          char name[128];
          std::snprintf(name, sizeof(name), "%s layer %zu %s [%lld x %lld x %lld]", m.name, i, call.what,
                        (long long)call.mm, (long long)call.nn, (long long)call.kk);
          Add({"gemm", name, ms, flops, "TFLOP/s", flops / (ms * 1e-3) / 1e12, l.sgemm, "SGEMM peak"});
        }
      }
      char name[128];
      std::snprintf(name, sizeof(name), "%s batch %lld: a step's GEMMs, summed", m.name, (long long)batch);
      Add({"gemm", name, total_ms, total_flops, "TFLOP/s", total_flops / (total_ms * 1e-3) / 1e12, l.sgemm,
           "SGEMM peak"});
    }
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));
}

// One training step of the MLP (784-256-128-10) as ferry-trainer enqueues it on a GPU: the
// parameters and the batch to the device, forward (GEMM, bias, ReLU), softmax cross-entropy
// forward and backward, backward (GEMMs for the weights' and the inputs' gradients, bias
// gradients, ReLU backward), the gradients back to the host; pinned host memory. Timed as enqueued
// call by call, and as one CUDA graph replayed (what the GPU needs once launches cost nothing).
// The difference is the cost of launching ~25 small calls one at a time.
void MlpStep(cudaStream_t s, cublasHandle_t blas) {
  const std::vector<int64_t> widths = {784, 256, 128, 10};
  const int layers = static_cast<int>(widths.size()) - 1;
  int64_t params = 0;
  std::vector<int64_t> w_at, b_at;
  for (int l = 0; l < layers; ++l) {
    w_at.push_back(params);
    params += widths[l] * widths[l + 1];
    b_at.push_back(params);
    params += widths[l + 1];
  }
  for (const int64_t batch : {int64_t{64}, int64_t{4096}}) {
    float* p = Upload(RandomFloats(size_t(params), 71, -0.05f, 0.05f));
    float* g = DeviceAlloc<float>(params);
    std::vector<float*> act(layers + 1), grad(layers + 1);
    for (int l = 0; l <= layers; ++l) {
      act[l] = DeviceAlloc<float>(batch * widths[l]);
      grad[l] = DeviceAlloc<float>(batch * widths[l]);
    }
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % 10);
    int32_t* d_labels = Upload(labels);
    float* probs = DeviceAlloc<float>(batch * 10);
    float* row_loss = DeviceAlloc<float>(batch);
    float* mean = DeviceAlloc<float>(1);
    float *h_params = nullptr, *h_x = nullptr, *h_grads = nullptr;
    CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&h_params), params * sizeof(float)));
    CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&h_x), batch * 784 * sizeof(float)));
    CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&h_grads), params * sizeof(float)));
    const std::vector<float> x = RandomFloats(size_t(batch * 784), 72, 0, 1);
    std::copy(x.begin(), x.end(), h_x);
    CHECK_CUDA(cudaMemcpy(h_params, p, params * sizeof(float), cudaMemcpyDeviceToHost));
    auto compute = [&] {
      for (int l = 0; l < layers; ++l) {
        const int64_t in = widths[l], out = widths[l + 1];
        CHECK_OK(kc::Gemm(blas, Transpose::kNo, Transpose::kNo, batch, out, in, 1.0f, act[l], in, p + w_at[l], out,
                          0.0f, act[l + 1], out, s));
        CHECK_OK(kc::BiasAdd(p + b_at[l], batch, out, act[l + 1], s));
        if (l + 1 < layers) CHECK_OK(kc::ReluForward(act[l + 1], batch * out, act[l + 1], s));
      }
      CHECK_OK(kc::SoftmaxCrossEntropyForward(act[layers], d_labels, batch, 10, probs, row_loss, mean, s));
      CHECK_OK(kc::SoftmaxCrossEntropyBackward(probs, d_labels, batch, 10, 1.0f / batch, grad[layers], s));
      for (int l = layers - 1; l >= 0; --l) {
        const int64_t in = widths[l], out = widths[l + 1];
        CHECK_OK(kc::Gemm(blas, Transpose::kYes, Transpose::kNo, in, out, batch, 1.0f, act[l], in, grad[l + 1], out,
                          0.0f, g + w_at[l], out, s));
        CHECK_OK(kc::BiasGrad(grad[l + 1], batch, out, g + b_at[l], s));
        if (l == 0) continue;
        CHECK_OK(kc::Gemm(blas, Transpose::kNo, Transpose::kYes, batch, in, out, 1.0f, grad[l + 1], out, p + w_at[l],
                          out, 0.0f, grad[l], in, s));
        CHECK_OK(kc::ReluBackward(act[l], grad[l], batch * in, grad[l], s));
      }
    };
    auto step = [&] {
      CHECK_CUDA(cudaMemcpyAsync(p, h_params, params * sizeof(float), cudaMemcpyHostToDevice, s));
      CHECK_CUDA(cudaMemcpyAsync(act[0], h_x, batch * 784 * sizeof(float), cudaMemcpyHostToDevice, s));
      compute();
      CHECK_CUDA(cudaMemcpyAsync(h_grads, g, params * sizeof(float), cudaMemcpyDeviceToHost, s));
    };
    char name[128];
    const double step_ms = MedianMs(s, step, 50, 5);
    std::snprintf(name, sizeof(name), "mlp step, batch %lld: copies + %s, enqueued call by call", (long long)batch,
                  "kernels");
    Add({"step", name, step_ms, 0, "-", 0, 0, ""});
    const double compute_ms = MedianMs(s, compute, 50, 5);
    std::snprintf(name, sizeof(name), "mlp step, batch %lld: kernels alone, enqueued call by call", (long long)batch);
    Add({"step", name, compute_ms, 0, "-", 0, 0, ""});
    // The same as graphs: what the GPU itself needs.
    for (const bool with_copies : {true, false}) {
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      if (e == cudaSuccess) {
        if (with_copies) {
          step();
        } else {
          compute();
        }
        e = cudaStreamEndCapture(s, &graph);
      }
      if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
      if (e != cudaSuccess) {
        std::printf("step       mlp step as a CUDA graph: %s (not measured)\n", cudaGetErrorString(e));
        static_cast<void>(cudaGetLastError());
        break;
      }
      const double graph_ms = MedianMs(s, [&] { CHECK_CUDA(cudaGraphLaunch(exec, s)); }, 50, 5);
      std::snprintf(name, sizeof(name), "mlp step, batch %lld: %s, one CUDA graph", (long long)batch,
                    with_copies ? "copies + kernels" : "kernels alone");
      Add({"step", name, graph_ms, 0, "-", 0, 0, ""});
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
    }
    CHECK_CUDA(cudaFreeHost(h_params));
    CHECK_CUDA(cudaFreeHost(h_x));
    CHECK_CUDA(cudaFreeHost(h_grads));
    for (int l = 0; l <= layers; ++l) {
      CHECK_CUDA(cudaFree(act[l]));
      CHECK_CUDA(cudaFree(grad[l]));
    }
    for (void* q : {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(d_labels),
                    static_cast<void*>(probs), static_cast<void*>(row_loss), static_cast<void*>(mean)}) {
      CHECK_CUDA(cudaFree(q));
    }
  }
}

void WriteJson(const char* path, const cudaDeviceProp& prop, int driver, int runtime) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "--json: cannot open %s\n", path);
    std::exit(1);
  }
  std::fprintf(f, "{\"device\": \"%s\", \"driver\": %d, \"runtime\": %d, \"sms\": %d, \"l2_bytes\": %d}\n",
               prop.name, driver, runtime, prop.multiProcessorCount, prop.l2CacheSize);
  for (const Row& r : g_rows) {
    std::fprintf(f,
                 "{\"group\": \"%s\", \"name\": \"%s\", \"ms\": %.6f, \"amount\": %.6g, \"unit\": \"%s\", "
                 "\"rate\": %.6g, \"limit\": %.6g, \"limit_name\": \"%s\"}\n",
                 r.group.c_str(), r.name.c_str(), r.ms, r.amount, r.unit.c_str(), r.rate, r.limit,
                 r.limit_name.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      g_quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "ferry-gpu-bench: no CUDA device here; nothing measured\n");
    return 3;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  std::printf("device: %s, %d SMs, L2 %d MiB, %.1f GiB; driver %d, runtime %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.totalGlobalMem / double(1 << 30), driver,
              runtime);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t blas;
  CHECK_CUBLAS(cublasCreate(&blas));
  Limits l = MeasureLimits(s, blas);
  Copies(s, &l);
  EmbeddingBags(s, l);
  Dedups(s, l);
  Losses(s, l);
  Elementwise(s, l);
  Gemms(s, blas, l);
  MlpStep(s, blas);
  if (json != nullptr) WriteJson(json, prop, driver, runtime);
  CHECK_CUBLAS(cublasDestroy(blas));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}
