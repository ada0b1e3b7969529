# The one torch pptrain builds against: the wheel installed in one Python environment.
#
# PPTRAIN_PYTHON names the interpreter (default: the repository's .venv/bin/python, made by
# scripts/setup-venv.sh, else the python3 on the PATH). It is asked once, here, for its torch's
# version, CMake folder and CUDA version; the C++ runtime, the programs and the Python extension
# modules all build against that torch and that interpreter, and the facts are recorded for
# `pptrain --version` and the package's import check (PPTRAIN_TORCH_VERSION).
#
# Only the wheel's own headers and libraries are used: CMake's system paths are off while torch's
# package files search for its libraries, and every library found must lie inside the wheel, so
# that a LibTorch of Debian's (libtorch-dev, python3-torch) is never picked up, installed or not.
# The wheel ships no headers of Gloo, which its ProcessGroupGloo.hpp includes; the few
# declarations that header needs are pptrain's own (pptrain/runtime/gloo_declarations/).

set(PPTRAIN_TORCH_MINIMUM 2.11)
set(PPTRAIN_PYTHON "" CACHE FILEPATH
    "Python interpreter whose torch pptrain builds against (default: .venv/bin/python)")
if(NOT PPTRAIN_PYTHON)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    set(PPTRAIN_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  else()
    find_program(PPTRAIN_PYTHON_ON_PATH NAMES python3 python)
    set(PPTRAIN_PYTHON ${PPTRAIN_PYTHON_ON_PATH})
  endif()
endif()
if(NOT PPTRAIN_PYTHON OR NOT EXISTS ${PPTRAIN_PYTHON})
  if(PPTRAIN_BUILD_RUNTIME)
    message(FATAL_ERROR "pptrain: no Python interpreter with torch (run scripts/setup-venv.sh, "
                        "or pass -DPPTRAIN_PYTHON=/path/to/python)")
  endif()
  set(PPTRAIN_PYTHON "")
  return()
endif()

message(STATUS "pptrain: Python ${PPTRAIN_PYTHON}")
if(NOT PPTRAIN_BUILD_RUNTIME)
  return()  # the planner and its Python module need no torch
endif()

execute_process(
  COMMAND ${PPTRAIN_PYTHON} -c
          "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _pptrain_torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE _pptrain_torch_error RESULT_VARIABLE _pptrain_torch_missing)
if(_pptrain_torch_missing)
  message(FATAL_ERROR "pptrain: ${PPTRAIN_PYTHON} cannot import torch (run scripts/setup-venv.sh, "
                      "or pass -DPPTRAIN_PYTHON=/path/to/python of an environment with torch)")
endif()
string(REPLACE "\n" ";" _pptrain_torch_facts "${_pptrain_torch_facts}")
list(GET _pptrain_torch_facts 0 PPTRAIN_TORCH_VERSION)
list(GET _pptrain_torch_facts 1 PPTRAIN_TORCH_CMAKE_DIR)
list(LENGTH _pptrain_torch_facts _pptrain_torch_fact_count)
set(PPTRAIN_TORCH_CUDA "")
if(_pptrain_torch_fact_count GREATER 2)
  list(GET _pptrain_torch_facts 2 PPTRAIN_TORCH_CUDA)
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _pptrain_torch_minor "${PPTRAIN_TORCH_VERSION}")
if(_pptrain_torch_minor VERSION_LESS PPTRAIN_TORCH_MINIMUM)
  message(FATAL_ERROR "pptrain: torch ${PPTRAIN_TORCH_VERSION} (${PPTRAIN_PYTHON}) is older than "
                      "${PPTRAIN_TORCH_MINIMUM}, the oldest pptrain supports")
endif()
get_filename_component(PPTRAIN_TORCH_DIR ${PPTRAIN_TORCH_CMAKE_DIR}/../.. ABSOLUTE)

# Newer torch headers refuse C++17 (torch/all.h says so): the project then builds as C++20.
file(READ ${PPTRAIN_TORCH_DIR}/include/torch/csrc/api/include/torch/all.h _pptrain_torch_all)
string(FIND "${_pptrain_torch_all}" "C++20 or later" _pptrain_needs_cxx20)
if(NOT _pptrain_needs_cxx20 EQUAL -1 AND CMAKE_CXX_STANDARD LESS 20)
  set(CMAKE_CXX_STANDARD 20)
  message(STATUS "pptrain: torch ${PPTRAIN_TORCH_VERSION}'s headers need C++20: building as C++20")
endif()

# A CUDA wheel's package files need the CUDA toolkit at configure time, even for CPU code.
if(PPTRAIN_TORCH_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND CUDAToolkit_ROOT AND EXISTS ${CUDAToolkit_ROOT}/bin/nvcc)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_ROOT}/bin/nvcc)
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(CMAKE_CUDA_COMPILER nvcc)
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "pptrain: torch ${PPTRAIN_TORCH_VERSION} is built for CUDA "
                        "${PPTRAIN_TORCH_CUDA}; its CMake files need a CUDA toolkit (nvcc): set "
                        "CUDAToolkit_ROOT")
  endif()
  # The H100/H200 generation, unless the user names others (CUDA 13 rejects below sm_75).
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST 9.0)
  endif()
endif()

set(_pptrain_system_path ${CMAKE_FIND_USE_CMAKE_SYSTEM_PATH})
set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH FALSE)
find_package(Torch REQUIRED CONFIG PATHS ${PPTRAIN_TORCH_CMAKE_DIR}/Torch NO_DEFAULT_PATH)
find_library(PPTRAIN_TORCH_PYTHON_LIBRARY torch_python PATHS ${PPTRAIN_TORCH_DIR}/lib
             NO_DEFAULT_PATH)
set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH ${_pptrain_system_path})

# Every torch library the build links, from the wheel and nowhere else.
set(_pptrain_torch_files ${TORCH_LIBRARY} ${PPTRAIN_TORCH_PYTHON_LIBRARY})
foreach(_target c10 torch_cpu)
  if(TARGET ${_target})
    get_target_property(_location ${_target} IMPORTED_LOCATION_RELEASE)
    if(NOT _location)
      get_target_property(_location ${_target} IMPORTED_LOCATION)
    endif()
    list(APPEND _pptrain_torch_files ${_location})
  endif()
endforeach()
foreach(_file IN LISTS _pptrain_torch_files)
  get_filename_component(_file ${_file} REALPATH)
  string(FIND "${_file}" "${PPTRAIN_TORCH_DIR}/" _inside)
  if(NOT _inside EQUAL 0)
    message(FATAL_ERROR "pptrain: ${_file} is not torch ${PPTRAIN_TORCH_VERSION}'s own "
                        "(${PPTRAIN_TORCH_DIR}); remove the other LibTorch from the search paths")
  endif()
endforeach()
# The wheel's libraries need the CUDA libraries of its nvidia-* packages (libtorch_cuda: NCCL,
# cuBLAS, ...), which the CUDA toolkit also has, older: the linker must resolve them from the
# wheel's (they are what runs, through libtorch_cuda's own RPATH), not from /usr/local/cuda.
file(GLOB _pptrain_nvidia_lib_dirs LIST_DIRECTORIES true ${PPTRAIN_TORCH_DIR}/../nvidia/*/lib)
set(PPTRAIN_TORCH_LINK_OPTIONS "")
foreach(_dir IN LISTS _pptrain_nvidia_lib_dirs)
  get_filename_component(_dir ${_dir} ABSOLUTE)
  list(APPEND PPTRAIN_TORCH_LINK_OPTIONS "-Wl,-rpath-link,${_dir}")
endforeach()

# What `cmake --install` puts in place finds the wheel's libraries where the build found them.
set(CMAKE_INSTALL_RPATH ${PPTRAIN_TORCH_DIR}/lib)
message(STATUS "pptrain: torch ${PPTRAIN_TORCH_VERSION} from ${PPTRAIN_TORCH_DIR}")
