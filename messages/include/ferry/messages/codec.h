// ferry/messages/codec.h — the value formats of compressed tables (protocol 1.6; PROTOCOL.md,
// "Compressed tables"): 16-bit values (fp16, bf16) and top-k frames of dense pushes.
//
// Both ends use these functions, so what one encodes the other decodes bit for bit. Every
// function is deterministic (no threads, no data-dependent order), which keeps sync jobs bitwise
// reproducible. Frames are little-endian and may sit at any address (ZeroMQ keeps small messages
// inline): nothing here assumes alignment of a frame pointer.
// Thread-safety: plain functions over caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry::wire {

// Bytes one value takes in a frame of format `w`: 4 (f32), 2 (fp16, bf16).
constexpr int64_t ValueBytes(ferry::WireFormat w) { return w == ferry::WireFormat::kF32 ? 4 : 2; }

// ---- 16-bit values -------------------------------------------------------------------------
//
// fp16 (IEEE binary16), round to nearest even: relative error <= 2^-11 for |x| in [2^-14, 65504]
// (below, absolute error <= 2^-25: subnormals); a finite |x| >= 65520 (which would round to Inf)
// becomes +-65504 (saturated, counted); Inf stays Inf; NaN becomes a quiet NaN of the same sign.
// bf16 (the upper 16 bits of a float32), round to nearest even: relative error <= 2^-8 over
// float32's normal range; a finite value that would round past the largest bf16 (3.3895e38)
// becomes it (saturated, counted); Inf stays Inf, NaN a quiet NaN.
// Encoders return how many finite values they saturated. Decoding is exact (every 16-bit value
// is a float32).

int64_t EncodeF16(const float* in, int64_t n, void* out);
void DecodeF16(const void* in, int64_t n, float* out);
int64_t EncodeBf16(const float* in, int64_t n, void* out);
void DecodeBf16(const void* in, int64_t n, float* out);

// By format: f32 is a copy (nothing saturates). `out` holds n * ValueBytes(w) bytes.
int64_t EncodeValues(ferry::WireFormat w, const float* in, int64_t n, void* out);
void DecodeValues(ferry::WireFormat w, const void* in, int64_t n, float* out);

// One value as the receiver will see it (encode, then decode).
float RoundTrip(ferry::WireFormat w, float x);

// ---- top-k frames (dense pushes of a table with topk_ratio > 0) ----------------------------
//
// A chunk of n elements travels as k = TopKCount(ratio, n) pairs: first k uint32 indices into
// the chunk, strictly increasing, then the k values at those indices in the table's format.
// The k elements are those of largest magnitude (|x| compared as float32; NaN above Inf above
// every finite value); among equal magnitudes the lower index goes first (deterministic).

// k = ceil(ratio * n) computed in double with a relative slack of 1e-7 (so that a ratio such as
// 0.3f, a hair above 0.3 as a float, gives 3 of 10, not 4), clamped to [1, n]; 0 when n is 0.
int64_t TopKCount(float ratio, int64_t n);
// Bytes of a top-k frame of a chunk of n: k * (4 + ValueBytes(w)).
int64_t TopKFrameBytes(ferry::WireFormat w, float ratio, int64_t n);

// Writes the indices of the k largest-magnitude elements of x[0, n), increasing, into idx[0, k).
// `scratch` is reused between calls (at most max(2048, n) uint32).
void SelectTopK(const float* x, int64_t n, int64_t k, uint32_t* idx, std::vector<uint32_t>* scratch);

// Error feedback, one chunk: `acc` holds gradient + residual (the caller adds them). Writes the
// top-k frame of acc[0, n) (k = TopKCount(ratio, n); `frame` holds TopKFrameBytes) and leaves in
// acc what was not sent: 0 where a value was sent exactly, the rounding error x - RoundTrip(x)
// where it was sent in 16 bits (exact in float32, so sent + residual == acc bit for bit), and 0
// where a NaN or Inf was sent (it is not carried into the next push). Returns values saturated.
int64_t EncodeTopK(ferry::WireFormat w, float ratio, float* acc, int64_t n, void* frame,
                   std::vector<uint32_t>* scratch);

// Decodes a top-k frame of `bytes` into the dense gradient out[0, n) (zero where nothing was
// sent). Refuses (INVALID_ARGUMENT, saying what and where) a frame of another size than
// TopKFrameBytes, or whose indices are not strictly increasing or not below n; `out` is
// then unspecified.
Status DecodeTopK(ferry::WireFormat w, float ratio, const void* frame, size_t bytes, int64_t n, float* out);

}  // namespace ferry::wire
