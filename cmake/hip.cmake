# ATTND_GPU=hip: CMake's HIP language with a ROCm clang; every .cu under kernels/ compiles as HIP
# for ATTND_HIP_ARCH (kernels/CMakeLists.txt), host code links the HIP runtime (hip::host).
#   cmake -S . -B build-hip -G Ninja -DATTND_GPU=hip                       # gfx90a (MI200)
#   cmake -S . -B build-hip -G Ninja -DATTND_GPU=hip -DATTND_HIP_ARCH=gfx950   # MI355X, ROCm >= 6.4
# A ROCm install (/opt/rocm: the ROCm images) needs nothing more. Debian 12's ROCm 5.2 packages
# (hipcc, libamdhip64-dev) need two bridges, set up below: their CMake packages live under
# /usr/lib/<multiarch>/cmake, where CMake 3.25's HIP support does not look (a forwarding ROCm root
# of symlinks in the build folder points it there), and their clang 15 needs --rocm-path and
# --rocm-device-lib-path. Debian's clang 15 knows gfx90a and gfx940 but not gfx942 (MI300X) or
# gfx950 (MI355X): the MI355X build needs ROCm >= 6.4 (Dockerfile.rocm uses 7.0).
set(ATTND_HIP_ARCH "gfx90a" CACHE STRING
    "HIP offload arch(s), ;-separated: gfx90a (MI200), gfx942 (MI300), gfx950 (MI355X, ROCm >= 6.4)")
set(CMAKE_HIP_ARCHITECTURES "${ATTND_HIP_ARCH}")

# The compiler: ROCm's clang, or the clang that Debian's hipcc drives (clang++-15).
if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
  if(EXISTS /opt/rocm/llvm/bin/clang++)
    set(CMAKE_HIP_COMPILER /opt/rocm/llvm/bin/clang++)
  else()
    find_program(ATTND_HIPCC hipcc)
    if(NOT ATTND_HIPCC)
      message(FATAL_ERROR "ATTND_GPU=hip: no ROCm clang (/opt/rocm/llvm/bin/clang++) and no hipcc "
                          "(Debian: apt-get install hipcc, or scripts/hip-check.sh)")
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
    set(CMAKE_HIP_FLAGS_INIT
        "--rocm-path=/usr --rocm-device-lib-path=${debian_lib_dir}/amdgcn/bitcode")
    if(ATTND_HIP_ARCH MATCHES "gfx94[12]|gfx950")
      message(FATAL_ERROR "ATTND_HIP_ARCH=${ATTND_HIP_ARCH}: Debian's ROCm 5.2 (clang 15) cannot "
                          "target it; use gfx90a or gfx940 here, a ROCm >= 6.4 toolchain for "
                          "gfx950 (deploy/docker/Dockerfile.rocm)")
    endif()
  endif()
endif()

enable_language(HIP)
set(CMAKE_HIP_STANDARD 17)
set(CMAKE_HIP_STANDARD_REQUIRED ON)
set(CMAKE_HIP_EXTENSIONS OFF)
find_package(hip CONFIG REQUIRED HINTS "${CMAKE_HIP_COMPILER_ROCM_ROOT}" /opt/rocm)
message(STATUS "attnd: HIP build for ${ATTND_HIP_ARCH} with ${CMAKE_HIP_COMPILER} "
               "(ROCm root ${CMAKE_HIP_COMPILER_ROCM_ROOT})")
