# Header-only and source dependencies from MOEKIT_DEPS_DIR (filled by scripts/setup.sh from pinned packages).
if(NOT EXISTS "${MOEKIT_DEPS_DIR}/include/nlohmann/json.hpp")
  message(FATAL_ERROR "moekit: dependencies missing in ${MOEKIT_DEPS_DIR}; run scripts/setup.sh first")
endif()

find_package(Threads REQUIRED)

# nlohmann-json, CLI11 and fmt (header-only mode) share one include folder.
add_library(moekit_deps_headers INTERFACE)
target_include_directories(moekit_deps_headers SYSTEM INTERFACE "${MOEKIT_DEPS_DIR}/include")
target_compile_definitions(moekit_deps_headers INTERFACE FMT_HEADER_ONLY=1)

if(MOEKIT_BUILD_TESTS)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  add_subdirectory("${MOEKIT_DEPS_DIR}/googletest" "${moekit_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL SYSTEM)
endif()
