# Sparse MLA: host entry and CPU implementation in attn_kernels; the fp64 reference for tests.
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/sparse_mla.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
