# Sparse MLA: host entry and CPU implementation in attn_kernels; the fp64 reference for tests;
# the GPU kernels (gpu/) in GPU builds (CUDA or HIP: the CUDA-only files compile to nothing for
# HIP).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/sparse_mla.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
if(ATTND_GPU_ENABLED)
  target_sources(attn_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gpu/plan.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/simt.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/combine.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_lowh.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_lowh_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_lowh_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_auto.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_fp8.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_fp8.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_pp.cu
  )
endif()
