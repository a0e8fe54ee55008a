# Dense MLA prefill (non-absorbed, varlen).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mla_prefill.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
target_sources(attn_kernels_reference PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reference.cc)
