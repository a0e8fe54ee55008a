# The install test (ctest label `install`): installs the build folder into a fresh prefix, checks
# the installed package carries no kernel library, then configures, builds and runs the consumer
# project (consumer/) against it with find_package(attnd CONFIG REQUIRED).
#   cmake -DBUILD_DIR=build -DWORK_DIR=/tmp/w -DCONSUMER_DIR=tests/install/consumer
#         -DGENERATOR=Ninja -DCXX_COMPILER=/usr/bin/c++ -DBUILD_TYPE=Release -DLIBDIR=lib
#         [-DLAUNCHER=ccache] [-DCXX_FLAGS=...] [-DEXE_LINKER_FLAGS=...]
#         -P tests/install/install_test.cmake
foreach(var BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX_COMPILER BUILD_TYPE LIBDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_test: -D${var}= is required")
  endif()
endforeach()

# run(<what> <command...>): runs the command, fails the test with its output when it fails.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_test: ${what} failed (${rc}):\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

set(cmakedir ${prefix}/${LIBDIR}/cmake/attnd)
foreach(f attndConfig.cmake attndConfigVersion.cmake attndTargets.cmake)
  if(NOT EXISTS ${cmakedir}/${f})
    message(FATAL_ERROR "install_test: ${cmakedir}/${f} was not installed")
  endif()
endforeach()
foreach(f bin/attnd bin/attnctl ${LIBDIR}/libattn_client.a include/attnd/client/client.h
          include/attnd/attnd/version.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install_test: ${prefix}/${f} was not installed")
  endif()
endforeach()
# The client library carries no kernels: no kernel library is installed, and the exported targets
# name none (nor a GPU runtime).
file(GLOB_RECURSE kernel_libs ${prefix}/*attn_kernels.* ${prefix}/*attn_kernels_reference.*)
if(kernel_libs)
  message(FATAL_ERROR "install_test: kernel libraries installed: ${kernel_libs}")
endif()
file(GLOB export_files ${cmakedir}/attndTargets*.cmake)
foreach(f IN LISTS export_files)
  file(READ ${f} text)
  if(text MATCHES "attn_kernels[^_]|attn_kernels_reference|CUDA::|hip::")
    message(FATAL_ERROR "install_test: ${f} names a kernel library or GPU runtime "
                        "(\"${CMAKE_MATCH_0}\")")
  endif()
endforeach()

set(consumer_args -S ${CONSUMER_DIR} -B ${WORK_DIR}/consumer -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    -DCMAKE_PREFIX_PATH=${prefix})
if(CXX_FLAGS)
  list(APPEND consumer_args "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
endif()
if(EXE_LINKER_FLAGS)
  list(APPEND consumer_args "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}")
endif()
if(LAUNCHER)
  list(APPEND consumer_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
run("configuring the consumer" ${CMAKE_COMMAND} ${consumer_args})
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run("running the consumer" ${WORK_DIR}/consumer/attnd_consumer)
message(STATUS "install_test: ${run_output}")
if(NOT run_output MATCHES "^attnd [0-9]+\\.[0-9]+\\.[0-9]+: TopK request")
  message(FATAL_ERROR "install_test: unexpected consumer output: ${run_output}")
endif()
