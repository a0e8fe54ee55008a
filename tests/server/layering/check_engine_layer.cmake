# The engine layer uses no gRPC (ctest layering_engine_without_grpc, tests/server/CMakeLists.txt):
#   1. no file under server/engine includes a gRPC, protobuf, generated-API or Prometheus header,
#      or a header of a layer the engine does not link (ops, grpc, main, metrics);
#   2. grpc_probe.cc linked against attn_engine alone failed, on undefined gRPC symbols and on
#      nothing of attnd's (PROBE_LOG, written by capture_link.sh when the probe is built);
#   3. the same source linked with gRPC::grpc++ as well runs (CONTROL): the probe is sound, so
#      the failure in 2 comes from the engine's link interface, which has no gRPC.
#   cmake -DSOURCE_DIR=<repository> -DPROBE_LOG=<log> -DCONTROL=<executable> -P <this file>
cmake_minimum_required(VERSION 3.25)
foreach(var SOURCE_DIR PROBE_LOG CONTROL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_engine_layer: -D${var}=... is required")
  endif()
endforeach()
set(failures "")

# 1. The includes of every file under server/engine.
file(GLOB_RECURSE engine_files LIST_DIRECTORIES false RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/server/engine/*)
if(NOT "server/engine/scheduler.cc" IN_LIST engine_files)
  message(FATAL_ERROR "check_engine_layer: no server/engine/scheduler.cc under ${SOURCE_DIR}")
endif()
set(forbidden_include "^[ \t]*#[ \t]*include[ \t]*[<\"](grpc/|grpcpp/|grpc[+][+]/|google/protobuf/|\
attnd/v1/|prometheus/|server/(ops|grpc|main|metrics)/|[^\">]*[.]pb[.]h)")
list(LENGTH engine_files scanned)
foreach(f IN LISTS engine_files)
  file(STRINGS ${SOURCE_DIR}/${f} lines REGEX "${forbidden_include}")
  foreach(line IN LISTS lines)
    string(APPEND failures "\n  ${f}: ${line}")
  endforeach()
endforeach()

# 2. The link of the probe against attn_engine alone.
if(NOT EXISTS ${PROBE_LOG})
  message(FATAL_ERROR "check_engine_layer: ${PROBE_LOG} is missing: build engine_grpc_probe")
endif()
file(READ ${PROBE_LOG} log)
if(NOT log MATCHES "link exit status: ([0-9]+)")
  message(FATAL_ERROR "check_engine_layer: ${PROBE_LOG} has no link exit status")
endif()
set(link_status ${CMAKE_MATCH_1})
# GNU ld: "undefined reference to `grpc::...'"; lld: "undefined symbol: grpc::...".
string(REGEX MATCHALL "undefined (reference to `|symbol: )[^'\n]*" undefined "${log}")
set(grpc_refs ${undefined})
list(FILTER grpc_refs INCLUDE REGEX "(`|: )(grpc|gpr)")
set(attnd_refs ${undefined})
list(FILTER attnd_refs INCLUDE REGEX "(`|: )attnd::")
list(LENGTH grpc_refs num_grpc_refs)
if(link_status EQUAL 0)
  string(APPEND failures "\n  engine_grpc_probe linked against attn_engine alone: the engine's "
                         "link interface provides gRPC (${PROBE_LOG})")
elseif(num_grpc_refs EQUAL 0 OR attnd_refs)
  string(APPEND failures "\n  engine_grpc_probe failed to link, but not on gRPC symbols alone "
                         "(${PROBE_LOG}):\n${log}")
endif()

# 3. The control: the same source with gRPC linked.
execute_process(COMMAND ${CONTROL} RESULT_VARIABLE control_status)
if(NOT control_status EQUAL 0)
  string(APPEND failures "\n  ${CONTROL} (the probe with gRPC linked) exited ${control_status}")
endif()

if(failures)
  message(FATAL_ERROR "the engine layer reaches gRPC:${failures}")
endif()
list(GET grpc_refs 0 first_ref)
message(STATUS "server/engine: ${scanned} files include no gRPC, protobuf or upper-layer header; "
               "linked against attn_engine alone the gRPC probe fails with ${num_grpc_refs} "
               "undefined gRPC references (first: ${first_ref}'); with gRPC it links and runs")
