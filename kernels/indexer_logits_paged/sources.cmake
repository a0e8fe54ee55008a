# Paged (decode) indexer logits; its CPU kernel shares kernels/indexer_logits/cpu_tile.cc and its
# GPU kernels the templates in kernels/indexer_logits/gpu/.
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/indexer_logits_paged.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
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
