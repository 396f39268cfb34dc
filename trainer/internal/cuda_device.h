// trainer/internal/cuda_device.h — the CUDA backend's factory (defined in
// cuda_device.cc, compiled only when FERRY_HAVE_CUDA). No CUDA header here.
#pragma once

#include <memory>

#include "ferry/status.h"
#include "ferry/trainer/device.h"

namespace ferry::trainer::internal {

// GPU `gpu`: sets it current for this thread, creates a non-blocking stream and a cuBLAS handle.
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int gpu);

}  // namespace ferry::trainer::internal
