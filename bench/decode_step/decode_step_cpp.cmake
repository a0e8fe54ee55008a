# decode_step_cpp: the decode-step benchmark's C++ frontend (bench/decode_step/decode_step_cpp.cc,
# docs/BENCHMARKS.md "Decode step"), CUDA only: its own producer/consumer kernels, the C++ client
# (prepared calls, submission ring) and the in-process baseline through attn_kernels. To be
# included from bench/CMakeLists.txt inside `if(ATTND_GPU STREQUAL "cuda")` (it is):
#   include(decode_step/decode_step_cpp.cmake)
add_executable(decode_step_cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode_step_cpp.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_step_kernels.cu
)
target_link_libraries(decode_step_cpp PRIVATE attn_client attn_kernels CUDA::cudart)
attnd_target_defaults(decode_step_cpp)
attnd_cuda_flags(decode_step_cpp)

# handoff_probe: the GPU-timeline cost of handing work between two processes (handoff_probe.cu,
# docs/BENCHMARKS.md "Cross-process hand-off on the GPU timeline"); CUDA runtime only.
add_executable(handoff_probe ${CMAKE_CURRENT_LIST_DIR}/handoff_probe.cu)
# The tail form launches a graph from the device: relocatable device code (CMake links
# cudadevrt for it).
set_target_properties(handoff_probe PROPERTIES CUDA_SEPARABLE_COMPILATION ON)
target_link_libraries(handoff_probe PRIVATE CUDA::cudart)
attnd_target_defaults(handoff_probe)
attnd_cuda_flags(handoff_probe)
