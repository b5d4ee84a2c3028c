# Install rules: the static libraries, the public headers, the CLI, and a CMake package, so that an engine's build
# finds moekit with `find_package(moekit 0.1 CONFIG REQUIRED)` and links `moekit::moekit` (the benchmark harness:
# `moekit::bench`). The package looks up what the libraries link: Threads, and with CUDA the CUDA toolkit (cudart,
# cupti and cublas for the harness) and the NCCL library this build found.
include(CMakePackageConfigHelpers)

set(MOEKIT_INSTALL_TARGETS moekit moekit_core moekit_routing moekit_experts moekit_runtime moekit_parallel moekit_bench)
if(MOEKIT_HAS_CUDA)
  list(APPEND MOEKIT_INSTALL_TARGETS moekit_routing_cuda moekit_experts_cuda)
endif()
set(MOEKIT_PACKAGE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/moekit")

install(TARGETS ${MOEKIT_INSTALL_TARGETS} EXPORT moekitTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${moekit_SOURCE_DIR}/include/moekit" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
if(MOEKIT_BUILD_TOOLS)
  install(TARGETS moekit_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()
install(EXPORT moekitTargets NAMESPACE moekit:: DESTINATION "${MOEKIT_PACKAGE_DIR}")

configure_package_config_file("${moekit_SOURCE_DIR}/cmake/moekitConfig.cmake.in"
                              "${CMAKE_CURRENT_BINARY_DIR}/moekitConfig.cmake" INSTALL_DESTINATION "${MOEKIT_PACKAGE_DIR}")
# 0.x: a minor version may change the API.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/moekitConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/moekitConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/moekitConfigVersion.cmake"
        DESTINATION "${MOEKIT_PACKAGE_DIR}")
