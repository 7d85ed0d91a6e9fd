# olmax::pjrt: the PJRT C API header for olmax/backend/xla/pjrt_runtime.hpp. olmax does not ship the
# header (third-party source): point OLMAX_PJRT_INCLUDE_DIR at the folder that contains
# xla/pjrt/c/pjrt_c_api.h, taken from the openxla/xla commit your jax / libtpu release pins.
# Without it the PJRT runtime is not built; the StableHLO emitter is, and its tests still run.
set(OLMAX_PJRT_INCLUDE_DIR "" CACHE PATH "Folder containing xla/pjrt/c/pjrt_c_api.h (enables olmax::pjrt and its tests)")
if(OLMAX_PJRT_INCLUDE_DIR AND NOT TARGET olmax::pjrt)
  set(olmax_pjrt_header "${OLMAX_PJRT_INCLUDE_DIR}/xla/pjrt/c/pjrt_c_api.h")
  if(NOT EXISTS "${olmax_pjrt_header}")
    message(FATAL_ERROR "OLMAX_PJRT_INCLUDE_DIR=${OLMAX_PJRT_INCLUDE_DIR} has no xla/pjrt/c/pjrt_c_api.h")
  endif()
  file(STRINGS "${olmax_pjrt_header}" olmax_pjrt_major REGEX "^#define PJRT_API_MAJOR [0-9]+")
  file(STRINGS "${olmax_pjrt_header}" olmax_pjrt_minor REGEX "^#define PJRT_API_MINOR [0-9]+")
  string(REGEX REPLACE ".* " "" olmax_pjrt_major "${olmax_pjrt_major}")
  string(REGEX REPLACE ".* " "" olmax_pjrt_minor "${olmax_pjrt_minor}")
  message(STATUS "olmax: PJRT C API header ${olmax_pjrt_header}: API ${olmax_pjrt_major}.${olmax_pjrt_minor} "
                 "(plugins newer than this may reject olmax's struct sizes)")
  add_library(olmax_pjrt INTERFACE)
  add_library(olmax::pjrt ALIAS olmax_pjrt)
  # SYSTEM + -fpermissive: GCC rejects the header's PJRT_Api fields that reuse their typedef names
  # ("changes meaning"); clang accepts them. With both, GCC compiles it without diagnostics.
  target_include_directories(olmax_pjrt SYSTEM INTERFACE "${OLMAX_PJRT_INCLUDE_DIR}")
  target_compile_options(olmax_pjrt INTERFACE $<$<CXX_COMPILER_ID:GNU>:-fpermissive>)
  target_link_libraries(olmax_pjrt INTERFACE olmax::olmax ${CMAKE_DL_LIBS})
endif()
