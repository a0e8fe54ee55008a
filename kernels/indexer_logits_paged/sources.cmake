# Paged (decode) indexer logits; its CPU kernel shares kernels/indexer_logits/cpu_tile.cc.
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/indexer_logits_paged.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
