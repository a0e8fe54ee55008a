# Dense MLA decode (absorbed, paged).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mla_decode.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference.cc)
