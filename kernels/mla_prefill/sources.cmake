# Dense MLA prefill (non-absorbed, varlen): host entry, CPU implementation, fp64 reference, and
# the GPU kernels (gpu/) in GPU builds (CUDA or HIP).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mla_prefill.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference.cc)
if(ATTND_GPU_ENABLED)
  target_sources(attn_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gpu/plan.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/schedule.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/simt.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_d192.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma_dims.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma_d192.cu
  )
endif()
