# Dense MLA decode (absorbed, paged): host entry, CPU implementation, fp64 reference, and the GPU
# kernels (gpu/) in GPU builds (CUDA or HIP).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mla_decode.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference.cc)
if(ATTND_GPU_ENABLED)
  target_sources(attn_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gpu/plan.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/simt.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/combine.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/schedule.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_pad_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_pad_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_pp.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_sf.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d512_fast.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d576_fast.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_fp8_d512.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_fp8_d576.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_fp8_d512_fast.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_fp8_d576_fast.cu
  )
endif()
