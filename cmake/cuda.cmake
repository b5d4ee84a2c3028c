# CUDA: enabled when nvcc is found. Every kernel targets sm_90a (wgmma, TMA, setmaxnreg).
set(MOEKIT_HAS_CUDA OFF)
if(MOEKIT_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(MOEKIT_HAS_CUDA ON)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # ptxas warns where a kernel uses local memory (a stack frame, spilled registers) and -Werror=all-warnings makes
    # that an error: every kernel keeps its state in registers and shared memory, so a change that spills fails the
    # build here and in CI instead of slowing a kernel unseen.
    set(MOEKIT_CUDA_FLAGS -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo
        -Xcompiler=-Wall -Werror=all-warnings -Xptxas=--warn-on-local-memory-usage,--warn-on-spills)
    set(MOEKIT_CUTLASS_INCLUDE "${MOEKIT_DEPS_DIR}/cutlass/include")
    message(STATUS "moekit: CUDA ${CUDAToolkit_VERSION} found, building sm_90a kernels")
  else()
    message(STATUS "moekit: nvcc not found, building the CPU backend only")
  endif()
endif()

# Applies moekit's CUDA flags to a target's .cu files.
function(moekit_cuda_target target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${MOEKIT_CUDA_FLAGS}>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()

# CUTLASS translation units need -DNDEBUG (without it ptxas serializes wgmma, warning C7510) and its headers.
function(moekit_cutlass_sources target)
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "-DNDEBUG")
  target_include_directories(${target} SYSTEM PRIVATE "${MOEKIT_CUTLASS_INCLUDE}")
endfunction()
