target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/indexer_logits.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_tile.cc
)
if(ATTND_GPU_ENABLED)
  target_sources(attn_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gpu/simt.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/wgmma.cu
  )
endif()
target_sources(attn_kernels_reference PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
