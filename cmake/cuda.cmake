# Optional CUDA backend. COMET_CUDA=AUTO enables it when a CUDA compiler is found.
set(COMET_HAVE_CUDA OFF)
if(NOT COMET_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(COMET_HAVE_CUDA ON)
  elseif(COMET_CUDA STREQUAL "ON")
    message(FATAL_ERROR "COMET_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

if(COMET_HAVE_CUDA)
  # Our targets (H200 = sm_90a, A100 = sm_80), unless the user passes -DCMAKE_CUDA_ARCHITECTURES.
  # Set before enable_language(CUDA): afterwards CMake has filled in the compiler's default
  # (sm_52 for CUDA 12, sm_75 for CUDA 13), too old for cp.async / mma.sync.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90a;80" CACHE STRING "CUDA architectures to build for")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # The W4Ax GEMM's Hopper kernel (wgmma, setmaxnreg) needs sm_90a code; "90" or "native" on
  # an H100/H200 gives plain sm_90, where the GEMM falls back to its sm_80 kernels (correct,
  # several times slower from 9 tokens up). Say so at configure time.
  set(comet_archs "${CMAKE_CUDA_ARCHITECTURES}")
  if(comet_archs MATCHES "native")
    set(comet_archs "${CMAKE_CUDA_ARCHITECTURES_NATIVE}")
  endif()
  if(comet_archs MATCHES "(^|;)90(-real|-virtual)?(;|$)" AND NOT comet_archs MATCHES "(^|;)90a")
    message(WARNING "comet: CMAKE_CUDA_ARCHITECTURES='${CMAKE_CUDA_ARCHITECTURES}' builds sm_90 "
                    "without 90a: on Hopper the W4Ax GEMM runs its sm_80 kernels, not the wgmma one. "
                    "Use -DCMAKE_CUDA_ARCHITECTURES=\"90a;80\" (the default).")
  endif()
  # Kernels (.cu) go into comet_cuda. The plain-C files of src/backend/cuda (gemm_w4ax_pack.c,
  # cuda_backend.c) are compiled into comet_lib by the top-level src/*.c glob, with or without
  # CUDA: cuda_backend.c sees COMET_HAVE_CUDA (set on comet_lib below) and the CUDA runtime
  # headers (through comet_cuda's public CUDA::cudart), and is a failing stub without them.
  file(GLOB COMET_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
  if(COMET_CU_SOURCES)
    add_library(comet_cuda STATIC ${COMET_CU_SOURCES})
    target_include_directories(comet_cuda PUBLIC ${CMAKE_SOURCE_DIR}/include
                               PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(comet_cuda PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
    target_compile_options(comet_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)
    target_link_libraries(comet_lib PUBLIC comet_cuda)
    # comet_lib was created before CUDA was enabled, so its CUDA_ARCHITECTURES is empty, which
    # CMake refuses ("CUDA_ARCHITECTURES is empty for target comet_lib") once it links CUDA code.
    set_target_properties(comet_lib PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    target_compile_definitions(comet_lib PUBLIC COMET_HAVE_CUDA=1)
    # NCCL (tensor parallelism over several GPUs, backend/cuda/cuda_comm.c): optional; without
    # it a tensor-parallel group has one GPU.
    find_path(COMET_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(COMET_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    if(COMET_NCCL_INCLUDE AND COMET_NCCL_LIB)
      target_include_directories(comet_lib PUBLIC ${COMET_NCCL_INCLUDE})
      target_link_libraries(comet_lib PUBLIC ${COMET_NCCL_LIB})
      target_compile_definitions(comet_lib PUBLIC COMET_HAVE_NCCL=1)
    endif()
    message(STATUS "comet: NCCL ${COMET_NCCL_LIB}")
  endif()
endif()
message(STATUS "comet: CUDA backend ${COMET_HAVE_CUDA}")
