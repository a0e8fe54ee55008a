# -Werror is the GCC build's gate. The clang sanitizer build (scripts/fuzz.sh) sets it OFF, so a
# warning only clang gives is reported there without stopping the build.
option(ATTND_WERROR "Treat C++ warnings as errors" ON)

# Per-target settings shared by every attnd target (no directory-wide flags).
function(attnd_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra $<$<BOOL:${ATTND_WERROR}>:-Werror>>)
  target_compile_features(${target} PUBLIC cxx_std_17)
endfunction()

# CPU kernels: vector ISA and loop optimisations, no fast-math (NaN must survive).
function(attnd_cpu_kernel_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-march=${ATTND_CPU_ARCH} -O3 -fno-math-errno -ffp-contract=fast>)
endfunction()

# CUDA targets: sm_90a code plus compute_80 PTX; warnings as errors on the host side.
set(ATTND_CUDA_GENCODE
    "-gencode=arch=compute_90a,code=sm_90a" "-gencode=arch=compute_80,code=compute_80")
# ATTND_DEBUG_HANG_TRAP: every mbarrier wait of the sm_90a kernels gives up after 4 s with a
# message and a trap (a diagnostic build for a kernel that hangs; docs/KERNELS.md "Finding a hang").
option(ATTND_DEBUG_HANG_TRAP "Diagnostic build: mbarrier waits trap after 4 s" OFF)
function(attnd_cuda_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${ATTND_CUDA_GENCODE} --expt-relaxed-constexpr -lineinfo
                               -Xcompiler=-Wall,-Wextra -Werror=all-warnings>)
  if(ATTND_DEBUG_HANG_TRAP)
    target_compile_definitions(${target} PRIVATE ATTND_DEBUG_HANG_TRAP=1)
  endif()
endfunction()

# HIP targets (ATTND_GPU=hip): warnings as errors in device and host code alike. The offload arch
# comes from ATTND_HIP_ARCH through CMAKE_HIP_ARCHITECTURES (cmake/hip.cmake).
function(attnd_hip_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:HIP>:-Wall -Wextra -Werror -Wno-unused-command-line-argument>)
endfunction()
