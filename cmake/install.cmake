# `cmake --install` and the attnd CMake package (docs/CONTRIBUTING.md "Installed layout"):
#   bin/                      attnd, attnctl                                  (component runtime)
#   <libdir>/                 libattn_client.a, libattn_proto.a, libattn_kernels_api.a
#   <includedir>/attnd/       client/*.h, the generated attnd/v1/*.pb.h and attnd/version.h, and
#                             the kernels' headers the client's headers include (no kernel code)
#   <libdir>/cmake/attnd/     attndConfig.cmake, attndConfigVersion.cmake, attndTargets*.cmake
#   <datadir>/attnd/proto/    the .proto files, for clients in other languages
# A consumer: find_package(attnd CONFIG REQUIRED) then target_link_libraries(app attnd::client).
# Everything but bin/ is component `development`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Headers are installed under <includedir>/attnd with the paths the sources use ("client/...",
# "kernels/...", "attnd/v1/..."), so consumers write the same #include lines as this repository.
set(ATTND_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/attnd)
set(ATTND_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnd)

# The exported targets: the client library and the two libraries its link interface names. They
# are attnd::client, attnd::proto (messages and stubs) and attnd::kernels_api (the tensor view and
# its checks, kernels/common/tensor.cc: no kernels, no GPU runtime). attn_kernels is not exported.
set_target_properties(attn_client PROPERTIES EXPORT_NAME client)
set_target_properties(attn_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(attn_kernels_api PROPERTIES EXPORT_NAME kernels_api)
install(TARGETS attn_client attn_proto attn_kernels_api
        EXPORT attndTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        INCLUDES DESTINATION ${ATTND_INSTALL_INCLUDEDIR})
install(TARGETS attnd attnctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# attnd_header_closure(<out> <headers...>): <headers> (paths relative to the repository root) and
# every header of this repository they include, directly or not (`#include "..."` lines that name
# a file of the source tree; generated and system headers are not). Configuring again when one
# of them changes keeps the list current.
function(attnd_header_closure out)
  set(seen "")
  set(todo ${ARGN})
  while(todo)
    list(POP_FRONT todo h)
    if(h IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${h})
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                 ${PROJECT_SOURCE_DIR}/${h})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${h} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS lines)
      if(line MATCHES "include[ \t]*\"([^\"]+)\"")
        set(inc ${CMAKE_MATCH_1})
        if(EXISTS ${PROJECT_SOURCE_DIR}/${inc} AND NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${inc})
          list(APPEND todo ${inc})
        endif()
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# The client's public headers and every header of the tree they include (from kernels/ and
# common/: params, tensor views, dtypes; headers only). A client header that includes one from
# elsewhere (server/, tests/) is a layering error and fails the configure here. A plain glob, not
# CONFIGURE_DEPENDS: with one, every `ninja -n` only plans a CMake re-run (the glob check cannot
# run in a dry run), which tests/deploy/test_docker.py reads; a new client header comes with a
# client/CMakeLists.txt change, which configures again anyway.
file(GLOB attnd_client_headers RELATIVE ${PROJECT_SOURCE_DIR}
     ${PROJECT_SOURCE_DIR}/client/*.h)
attnd_header_closure(attnd_installed_headers ${attnd_client_headers})
foreach(h IN LISTS attnd_installed_headers)
  if(NOT h MATCHES "^(client|common|kernels)/[^ ]+\\.h$")
    message(FATAL_ERROR "client/ headers include ${h}: only client/, common/ and kernels/ "
                        "headers may be installed (docs/CONTRIBUTING.md \"Installed layout\")")
  endif()
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${h} DESTINATION ${ATTND_INSTALL_INCLUDEDIR}/${dir}
          COMPONENT development)
endforeach()
# The generated headers: attn_proto's *.pb.h sources (every .proto the proto folder compiles) and
# attnd/version.h (client/CMakeLists.txt).
get_target_property(attnd_proto_sources attn_proto SOURCES)
get_target_property(attnd_proto_bin attn_proto BINARY_DIR)
foreach(src IN LISTS attnd_proto_sources)
  if(src MATCHES "\\.pb\\.h$")
    file(RELATIVE_PATH rel ${attnd_proto_bin}/gen ${src})  # proto/CMakeLists.txt: ATTND_PROTO_OUT
    get_filename_component(rel_dir ${rel} DIRECTORY)
    install(FILES ${src} DESTINATION ${ATTND_INSTALL_INCLUDEDIR}/${rel_dir} COMPONENT development)
  endif()
endforeach()
install(FILES ${ATTND_VERSION_HEADER} DESTINATION ${ATTND_INSTALL_INCLUDEDIR}/attnd
        COMPONENT development)
install(DIRECTORY ${ATTND_PROTO_DIR}/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnd/proto
        COMPONENT development FILES_MATCHING PATTERN "*.proto")

install(EXPORT attndTargets NAMESPACE attnd:: DESTINATION ${ATTND_INSTALL_CMAKEDIR}
        COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/attndConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attndConfig.cmake
                              INSTALL_DESTINATION ${ATTND_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attndConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attndConfig.cmake ${PROJECT_BINARY_DIR}/attndConfigVersion.cmake
        DESTINATION ${ATTND_INSTALL_CMAKEDIR} COMPONENT development)

# attnd_check_link_closure(<target> <forbidden...>): fails the configure when <target> links any
# of <forbidden>, directly or through any library it links (its whole link closure, imported
# targets included). Generator expressions are searched for target names as they stand, so a
# conditional link counts as a link.
function(attnd_check_link_closure target)
  set(seen "")
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(aliased ${t} ALIASED_TARGET)
    if(aliased)
      list(APPEND todo ${aliased})
      continue()
    endif()
    set(items "")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(v ${t} ${prop})
      if(v)
        list(APPEND items ${v})
      endif()
    endforeach()
    foreach(item IN LISTS items)
      # Names keep their "::" (gRPC::grpc++); a single ':' separates a generator expression's
      # parts ("$<LINK_ONLY:x>", "$<$<BOOL:..>:x>").
      string(REPLACE "::" "@@" item "${item}")
      string(REGEX MATCHALL "[A-Za-z0-9_.+@-]+" names "${item}")
      foreach(name IN LISTS names)
        string(REPLACE "@@" "::" name "${name}")
        if(name IN_LIST ARGN)
          message(FATAL_ERROR "${target} links ${name} (through ${t}); it must not "
                              "(docs/CONTRIBUTING.md \"Installed layout\")")
        endif()
        if(TARGET ${name})
          list(APPEND todo ${name})
        endif()
      endforeach()
    endforeach()
  endwhile()
endfunction()
# The client library carries no kernel code and no GPU runtime: only the kernels' headers and
# attn_kernels_api. Checked when the whole project has been read, so later links count too.
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL attnd_check_link_closure attn_client
               attn_kernels attn_kernels_reference CUDA::cudart CUDA::cuda_driver hip::host
               hip::device)
