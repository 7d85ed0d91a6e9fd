# olmax::pjrt: what code that includes olmax/xla/pjrt_runtime.hpp links. The runtime is
# header-only like the rest of olmax, but it needs the PJRT C API header (xla/pjrt/c/pjrt_c_api.h,
# third-party source that olmax does not ship) and libdl (plugins are loaded with dlopen).
#
# olmax_define_pjrt_target(<folder>) defines the target, for a folder holding the header either as
# xla/pjrt/c/pjrt_c_api.h (the openxla/xla tree) or as a flat pjrt_c_api.h (the xla-cpu-pjrt wheel's
# include/); olmax's own build calls it (top-level CMakeLists.txt) and so does the package config
# (installed, or through add_subdirectory / FetchContent) when the consumer sets
# OLMAX_PJRT_INCLUDE_DIR before it.
function(olmax_define_pjrt_target include_dir)
  if(TARGET olmax::pjrt)
    return()
  endif()
  set(header "${include_dir}/xla/pjrt/c/pjrt_c_api.h")
  if(NOT EXISTS "${header}")
    set(header "${include_dir}/pjrt_c_api.h")
  endif()
  if(NOT EXISTS "${header}")
    message(FATAL_ERROR "olmax: ${include_dir} holds neither xla/pjrt/c/pjrt_c_api.h nor pjrt_c_api.h (OLMAX_PJRT_INCLUDE_DIR must name the "
                        "folder that holds the PJRT C API header, e.g. the xla-cpu-pjrt wheel's include/)")
  endif()
  file(STRINGS "${header}" major REGEX "^#define PJRT_API_MAJOR [0-9]+")
  file(STRINGS "${header}" minor REGEX "^#define PJRT_API_MINOR [0-9]+")
  string(REGEX REPLACE ".* " "" major "${major}")
  string(REGEX REPLACE ".* " "" minor "${minor}")
  message(STATUS "olmax: PJRT C API header ${header}: API ${major}.${minor}")
  add_library(olmax_pjrt INTERFACE IMPORTED GLOBAL)
  add_library(olmax::pjrt ALIAS olmax_pjrt)
  # Code that links the target knows it (olmax/train/launch.hpp: device=xla on train::XlaStep).
  target_compile_definitions(olmax_pjrt INTERFACE OLMAX_HAS_PJRT)
  # SYSTEM + -fpermissive: GCC rejects the header's PJRT_Api fields that reuse their typedef names
  # ("changes meaning"); clang accepts them. With both, GCC compiles it without diagnostics.
  target_include_directories(olmax_pjrt SYSTEM INTERFACE "${include_dir}")
  target_compile_options(olmax_pjrt INTERFACE $<$<CXX_COMPILER_ID:GNU>:-fpermissive>)
  target_link_libraries(olmax_pjrt INTERFACE olmax::olmax ${CMAKE_DL_LIBS})
endfunction()
