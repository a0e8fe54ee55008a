# Per-target settings shared by every attnd target (no directory-wide flags).
function(attnd_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  target_compile_features(${target} PUBLIC cxx_std_17)
endfunction()

# CPU kernels: vector ISA and loop optimisations, no fast-math (NaN must survive).
function(attnd_cpu_kernel_flags target)
  target_compile_options(${target} PRIVATE -march=${ATTND_CPU_ARCH} -O3 -fno-math-errno -ffp-contract=fast)
endfunction()
