# Which nvcc builds the CUDA codec, in this order:
#  1. the one the user names: -DCMAKE_CUDA_COMPILER=... or $CUDACXX;
#  2. a system toolkit: $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin;
#  3. CUDA 13's nvcc from PyPI (nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cuda-runtime, nvidia-cuda-crt:
#     build requirements on Linux x86_64, also installed by jax[cuda13]) under site-packages/nvidia/cu13
#     of the Python that runs the build (the isolated build environment, or the venv with
#     --no-build-isolation).
# Sets CMAKE_CUDA_COMPILER (a compiler that is named or found is used, or fails the build loudly),
# ZIPCCL_NVCC_FROM (which of the three) and, for an nvcc from the wheels, the two workarounds they need.

if(CMAKE_CUDA_COMPILER)
  set(ZIPCCL_NVCC_FROM "CMAKE_CUDA_COMPILER")
elseif(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
  set(ZIPCCL_NVCC_FROM "CUDACXX")
  # as CMake reads it: a program (a path, or a name on PATH), then any arguments
  get_filename_component(CMAKE_CUDA_COMPILER "$ENV{CUDACXX}" PROGRAM PROGRAM_ARGS args)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "CUDACXX=$ENV{CUDACXX} names no program: unset it, or name an nvcc")
  endif()
  set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} ${args}")
else()
  find_program(ZIPCCL_SYSTEM_NVCC nvcc
               HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin"
               PATHS /usr/local/cuda/bin)
  # a system nvcc must run: /usr/local/bin/nvcc may be a wrapper around a toolkit that is gone
  if(ZIPCCL_SYSTEM_NVCC)
    execute_process(COMMAND "${ZIPCCL_SYSTEM_NVCC}" --version RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT rc EQUAL 0)
      unset(ZIPCCL_SYSTEM_NVCC CACHE)
    endif()
  endif()
  if(ZIPCCL_SYSTEM_NVCC)
    set(ZIPCCL_NVCC_FROM "a system toolkit")
    set(CMAKE_CUDA_COMPILER "${ZIPCCL_SYSTEM_NVCC}")
  else()
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
        "import os, nvidia; print(next((r for r in (os.path.join(p, 'cu13') for p in nvidia.__path__) if os.path.isfile(os.path.join(r, 'bin', 'nvcc'))), ''))"
      OUTPUT_VARIABLE root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(root)
      set(ZIPCCL_NVCC_FROM "PyPI (nvidia-cuda-nvcc)")
      set(CMAKE_CUDA_COMPILER "${root}/bin/nvcc")
    endif()
  endif()
endif()

# An nvcc from the wheels (however chosen): its root holds lib/ with cudart, and no lib64/
if(CMAKE_CUDA_COMPILER)
  get_filename_component(nvcc "${CMAKE_CUDA_COMPILER}" REALPATH)
  get_filename_component(root "${nvcc}" DIRECTORY)
  get_filename_component(root "${root}" DIRECTORY)
  if(EXISTS "${root}/lib/libcudart_static.a" AND NOT EXISTS "${root}/lib64")
    # nvcc.profile of the wheels 13.0-13.2 names lib64 where the libraries are in lib
    set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -L${root}/lib")
    # FindCUDAToolkit looks for an unversioned libcudart.so, which the wheel lacks
    if(NOT EXISTS "${root}/lib/libcudart.so")
      file(GLOB cudart "${root}/lib/libcudart.so.*")
      if(cudart)
        list(GET cudart 0 cudart)
        set(CUDA_CUDART "${cudart}" CACHE FILEPATH "libcudart (the nvidia-cuda-runtime wheel's)")
      endif()
    endif()
  endif()
endif()
