# Fused DSA layer: host entry and CPU implementation (calls the three steps' Run()); in GPU builds
# the device path (gpu.cc: the steps' GPU implementations back to back on one stream).
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dsa.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
)
if(ATTND_GPU_ENABLED)
  target_sources(attn_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gpu.cc)
endif()
