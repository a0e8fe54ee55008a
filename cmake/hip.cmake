# ATTND_GPU=hip: CMake's HIP language with a ROCm-style clang; every .cu under kernels/ compiles as
# HIP for ATTND_HIP_ARCH (kernels/CMakeLists.txt), host code links the HIP runtime (hip::host).
# docs/HIP.md describes the three compilers this accepts:
#   cmake -S . -B build-hip -G Ninja -DATTND_GPU=hip -DATTND_HIP_ARCH=gfx950     # /opt/rocm
#   cmake -S . -B build-hip -G Ninja -DATTND_GPU=hip -DATTND_HIP_ARCH="gfx90a;gfx942;gfx950" \
#     -DATTND_HIP_TOOLCHAIN=PREFIX         # scripts/setup-hip-toolchain.sh PREFIX (clang 22)
#   cmake -S . -B build-hip -G Ninja -DATTND_GPU=hip                             # Debian's hipcc
# - ROCm (/opt/rocm, the ROCm images): needs nothing more.
# - ATTND_HIP_TOOLCHAIN: clang 22 with Debian 12's ROCm 5.2 headers, runtime and device libraries
#   (the compile gate, scripts/hip-check.sh); it knows gfx90a, gfx942 and gfx950. Its flags go in
#   through HIPFLAGS, which CMake's compiler identification also uses: a -DCMAKE_HIP_FLAGS given
#   on the command line replaces them and must repeat them.
# - Debian's hipcc (ROCm 5.2, clang 15): gfx90a and gfx940 only.
# Debian's ROCm CMake packages live under /usr/lib/<multiarch>/cmake, where CMake 3.25's HIP
# support does not look: a forwarding ROCm root of symlinks in the build folder points it there.
set(ATTND_HIP_ARCH "gfx90a" CACHE STRING
    "HIP offload arch(s), ;-separated: gfx90a (MI200), gfx942 (MI300), gfx950 (MI355X)")
set(ATTND_HIP_TOOLCHAIN "" CACHE PATH
    "Prefix of scripts/setup-hip-toolchain.sh; empty: ROCm's clang (/opt/rocm) or Debian's hipcc")
set(CMAKE_HIP_ARCHITECTURES "${ATTND_HIP_ARCH}")

set(attnd_hip_route rocm)
if(ATTND_HIP_TOOLCHAIN)
  set(attnd_hip_route toolchain)
  if(NOT EXISTS "${ATTND_HIP_TOOLCHAIN}/bin/clang++")
    message(FATAL_ERROR "ATTND_HIP_TOOLCHAIN=${ATTND_HIP_TOOLCHAIN}: no bin/clang++ there (make it "
                        "with scripts/setup-hip-toolchain.sh)")
  endif()
  if(NOT CMAKE_HIP_COMPILER)
    set(CMAKE_HIP_COMPILER "${ATTND_HIP_TOOLCHAIN}/bin/clang++")
  endif()
  # ROCm 5.2's headers need the wave-size macro that clang 22 no longer predefines (64 on every
  # CDNA arch built here); its device libraries have no code-object-v6 control library.
  set(ENV{HIPFLAGS} "--rocm-path=/usr --rocm-device-lib-path=${ATTND_HIP_TOOLCHAIN}/amdgcn/bitcode \
-D__AMDGCN_WAVEFRONT_SIZE=64 -mcode-object-version=5 $ENV{HIPFLAGS}")
elseif(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
  if(EXISTS /opt/rocm/llvm/bin/clang++)
    set(CMAKE_HIP_COMPILER /opt/rocm/llvm/bin/clang++)
  else()
    # The clang that Debian's hipcc drives (clang++-15).
    set(attnd_hip_route hipcc)
    find_program(ATTND_HIPCC hipcc)
    if(NOT ATTND_HIPCC)
      message(FATAL_ERROR "ATTND_GPU=hip: no ROCm clang (/opt/rocm/llvm/bin/clang++), no "
                          "ATTND_HIP_TOOLCHAIN and no hipcc (scripts/hip-check.sh sets one up)")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env HIPCC_VERBOSE=1
                            ${ATTND_HIPCC} --offload-arch=gfx90a --version
                    OUTPUT_VARIABLE hipcc_out ERROR_VARIABLE hipcc_out)
    if(NOT hipcc_out MATCHES "hipcc-cmd: *([^ \n]+)")
      message(FATAL_ERROR "ATTND_GPU=hip: cannot tell which clang ${ATTND_HIPCC} runs; set "
                          "CMAKE_HIP_COMPILER")
    endif()
    set(CMAKE_HIP_COMPILER "${CMAKE_MATCH_1}")
  endif()
endif()

# Debian's layout: the packages' CMake files under /usr/lib/<multiarch>/cmake.
if(NOT CMAKE_HIP_COMPILER_ROCM_ROOT AND NOT EXISTS /opt/rocm/lib/cmake/hip-lang
   AND NOT EXISTS /usr/lib/cmake/hip-lang/hip-lang-config.cmake)
  file(GLOB debian_hip_lang /usr/lib/*/cmake/hip-lang/hip-lang-config.cmake)
  if(debian_hip_lang)
    list(GET debian_hip_lang 0 debian_hip_lang)
    get_filename_component(debian_cmake_dir "${debian_hip_lang}" DIRECTORY)
    get_filename_component(debian_cmake_dir "${debian_cmake_dir}" DIRECTORY)
    get_filename_component(debian_lib_dir "${debian_cmake_dir}" DIRECTORY)
    set(root "${CMAKE_BINARY_DIR}/rocm-root")
    file(MAKE_DIRECTORY "${root}/lib/cmake")
    foreach(pkg hip-lang hip amd_comgr hsa-runtime64)
      if(EXISTS "${debian_cmake_dir}/${pkg}" AND NOT EXISTS "${root}/lib/cmake/${pkg}")
        file(CREATE_LINK "${debian_cmake_dir}/${pkg}" "${root}/lib/cmake/${pkg}" SYMBOLIC)
      endif()
    endforeach()
    set(CMAKE_HIP_COMPILER_ROCM_ROOT "${root}")
    # hip-lang's own find_dependency() calls run in CMake's compiler checks too, where the
    # multiarch folder is not searched yet: the environment carries the forwarding root there.
    if(DEFINED ENV{CMAKE_PREFIX_PATH})
      set(ENV{CMAKE_PREFIX_PATH} "${root}:$ENV{CMAKE_PREFIX_PATH}")
    else()
      set(ENV{CMAKE_PREFIX_PATH} "${root}")
    endif()
    list(APPEND CMAKE_PREFIX_PATH "${root}")
    if(attnd_hip_route STREQUAL "hipcc")
      set(CMAKE_HIP_FLAGS_INIT
          "--rocm-path=/usr --rocm-device-lib-path=${debian_lib_dir}/amdgcn/bitcode")
    endif()
  endif()
endif()
if(attnd_hip_route STREQUAL "hipcc" AND ATTND_HIP_ARCH MATCHES "gfx94[12]|gfx950")
  message(FATAL_ERROR "ATTND_HIP_ARCH=${ATTND_HIP_ARCH}: Debian's ROCm 5.2 (clang 15) cannot "
                      "target it; use gfx90a or gfx940 here, ATTND_HIP_TOOLCHAIN "
                      "(scripts/hip-check.sh) or a ROCm >= 6.4 toolchain for gfx942/gfx950")
endif()

# ccache, as for C++ (CMakeLists.txt), in its depend mode: its preprocessor mode runs `clang -E`,
# which fails for several offload archs at once.
find_program(ATTND_CCACHE ccache)
if(ATTND_CCACHE AND NOT CMAKE_HIP_COMPILER_LAUNCHER)
  set(CMAKE_HIP_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_DEPEND=1 ${ATTND_CCACHE})
endif()

enable_language(HIP)
set(CMAKE_HIP_STANDARD 17)
set(CMAKE_HIP_STANDARD_REQUIRED ON)
set(CMAKE_HIP_EXTENSIONS OFF)
find_package(hip CONFIG REQUIRED HINTS "${CMAKE_HIP_COMPILER_ROCM_ROOT}" /opt/rocm)
message(STATUS "attnd: HIP build for ${ATTND_HIP_ARCH} with ${CMAKE_HIP_COMPILER} "
               "(ROCm root ${CMAKE_HIP_COMPILER_ROCM_ROOT})")
