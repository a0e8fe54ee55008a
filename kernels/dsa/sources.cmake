# Fused DSA layer: host entry and CPU implementation (calls the three steps' Run()).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dsa.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
