// Host side of TMA (CUDA only): encodes a tiled tensor map through the driver's
// cuTensorMapEncodeTiled, reached by gpu::DriverEntryPoint (no libcuda link). Encoding
// is a host computation: no stream work, safe during graph capture. Include from .cu files.
//   CUtensorMap map;
//   if (!EncodeBf16Map3d(&map, q, {192, 128, T}, {256, 256 * 128}, {64, 1, 128}, why)) ...
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/common/gpu/tma.h is CUDA-only"
#endif

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/common/supports.h"

namespace attnd::gpu {

using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                            const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                            const cuuint32_t*, CUtensorMapInterleave,
                                            CUtensorMapSwizzle, CUtensorMapL2promotion,
                                            CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, or null where the driver has none (looked up once).
inline TensorMapEncodeTiledFn TensorMapEncodeTiled() {
  static const auto fn =
      reinterpret_cast<TensorMapEncodeTiledFn>(DriverEntryPoint("cuTensorMapEncodeTiled"));
  return fn;
}

// A tiled tensor map of `rank` (1 to 5) dimensions and element type `type` over `base` (16-byte
// aligned): dims innermost first (elements), the byte strides of dims 1.. (multiples of 16,
// < 2^40), the box (its innermost extent at most 128 bytes), 128-byte swizzle, 256-byte L2
// promotion, out-of-range elements read as zeros. False with the reason when the driver refuses
// it.
inline bool EncodeTiledMap(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* base,
                           const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                           std::string* why) {
  const TensorMapEncodeTiledFn encode = TensorMapEncodeTiled();
  if (encode == nullptr) return kernels::Refuse(why, "the driver has no cuTensorMapEncodeTiled");
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  auto run = [&] {
    return encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides,
                  box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  // The driver call needs a current context, which the runtime makes current on a thread lazily
  // (a Supports() may be a thread's first CUDA call): cudaSetDevice does it, once per thread and
  // device; once more after a refusal for want of one (the context was reset since).
  thread_local int context_device = -1;
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && device != context_device &&
      cudaSetDevice(device) == cudaSuccess) {
    context_device = device;
  }
  CUresult r = run();
  if (r == CUDA_ERROR_INVALID_CONTEXT && cudaSetDevice(device) == cudaSuccess) r = run();
  static_cast<void>(cudaGetLastError());
  if (r != CUDA_SUCCESS) {
    return kernels::Refuse(why, "cuTensorMapEncodeTiled refused the tensor (error ",
                           static_cast<int>(r), ")");
  }
  return true;
}

// A 3-D bf16 tensor map (EncodeTiledMap; box[0] · 2 <= 128 bytes).
inline bool EncodeBf16Map3d(CUtensorMap* map, const void* base, const uint64_t (&dims)[3],
                            const uint64_t (&strides)[2], const uint32_t (&box)[3],
                            std::string* why) {
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t st[2] = {strides[0], strides[1]};
  const cuuint32_t b[3] = {box[0], box[1], box[2]};
  return EncodeTiledMap(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, d, st, b, why);
}

// A u8 (fp8 bytes) tensor map of `rank` dimensions (EncodeTiledMap; box[0] <= 128).
inline bool EncodeU8Map(CUtensorMap* map, int rank, const void* base, const cuuint64_t* dims,
                        const cuuint64_t* strides, const cuuint32_t* box, std::string* why) {
  return EncodeTiledMap(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, base, dims, strides, box, why);
}

}  // namespace attnd::gpu
