# Top-k operator (kernels/topk): host entry, CPU implementation, GPU implementation (GPU builds),
# fp64 reference.
target_sources(attn_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/topk.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu.cc
  ${CMAKE_CURRENT_LIST_DIR}/row_select.cc
)
target_sources(attn_kernels_reference PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
if(ATTND_GPU_ENABLED)  # stream.cu is CUDA-only inside (thread-block clusters on sm_90)
  target_sources(attn_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gpu/filter.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/simt.cu
    ${CMAKE_CURRENT_LIST_DIR}/gpu/stream.cu
  )
endif()
