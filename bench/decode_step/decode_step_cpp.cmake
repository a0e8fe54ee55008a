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
