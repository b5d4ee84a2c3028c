# Builds and runs tests/package's consumer against this build of moekit, as an engine would take it:
#   MODE=install:      `cmake --install` of MOEKIT_BUILD_DIR into WORK_DIR/prefix, then find_package(moekit);
#   MODE=subdirectory: add_subdirectory(MOEKIT_SOURCE_DIR) in the consumer's own build (CPU only, no tests, no CLI).
# cmake -DMODE=... -DMOEKIT_SOURCE_DIR=... -DMOEKIT_BUILD_DIR=... -DMOEKIT_DEPS_DIR=... -DWORK_DIR=...
#       -DGENERATOR=... -DCXX=... -DCXX_FLAGS=... -DLINK_FLAGS=... -P check.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT status EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "failed (${status}): ${command}\n${out}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer_build "${WORK_DIR}/consumer")
# The build's own compile and link flags (a sanitized build's libraries need its runtime linked in too).
set(configure ${CMAKE_COMMAND} -S "${MOEKIT_SOURCE_DIR}/tests/package" -B "${consumer_build}" -G "${GENERATOR}"
              -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
              "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}" "-DCMAKE_SHARED_LINKER_FLAGS=${LINK_FLAGS}")
if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install "${MOEKIT_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  foreach(installed include/moekit/layer.h lib/cmake/moekit/moekitConfig.cmake)
    if(NOT EXISTS "${WORK_DIR}/prefix/${installed}")
      message(FATAL_ERROR "the install has no ${installed}")
    endif()
  endforeach()
  run(${configure} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "subdirectory")
  run(${configure} -DMOEKIT_SOURCE_DIR=${MOEKIT_SOURCE_DIR} -DMOEKIT_DEPS_DIR=${MOEKIT_DEPS_DIR}
      -DMOEKIT_ENABLE_CUDA=OFF)
  # A subproject builds only moekit's libraries: no CLI, no tests, no install rules.
  if(EXISTS "${consumer_build}/moekit/tools" OR EXISTS "${consumer_build}/moekit/tests")
    message(FATAL_ERROR "moekit as a subproject configured its CLI or tests")
  endif()
else()
  message(FATAL_ERROR "MODE must be install or subdirectory, not '${MODE}'")
endif()
run(${CMAKE_COMMAND} --build "${consumer_build}" --target consumer)
run("${consumer_build}/consumer")
message(STATUS "${output}")
if(NOT output MATCHES "consumer: ok")
  message(FATAL_ERROR "the consumer did not report ok")
endif()
