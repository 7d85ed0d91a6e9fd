# olmax::onednn: what code that includes olmax/backend/onednn_gemm.hpp links (bf16 and fp32 GEMM
# through oneDNN, on the CPU's bf16 units where it has them). Header-only like the rest of olmax, but
# it needs oneDNN's header oneapi/dnnl/dnnl.hpp and its library libdnnl, 2.x (Debian 12: libdnnl-dev)
# or 3.x (tools/setup_onednn3.sh fetches one; point OLMAX_ONEDNN_INCLUDE_DIR / _LIBRARY at it).
# The rest of olmax, olmax/backend/bf16_gemm.hpp (the portable bf16 GEMM) included, needs neither.
#
# olmax finds oneDNN itself (find_path / find_library) rather than through find_package(dnnl):
# Debian's dnnl-config.cmake (2.6.3) requires OpenCL's development files even for CPU use (its GPU
# runtime is OpenCL) and stops the configure step when they are absent. A DNNL::dnnl target that the
# consumer already made (its own find_package(dnnl)) is used as it is.
#
# olmax_find_onednn() sets OLMAX_ONEDNN_INCLUDE_DIR / OLMAX_ONEDNN_LIBRARY (cache; set them to pick
# another oneDNN) and olmax_onednn_FOUND; olmax_define_onednn_target() then defines the target.
# olmax's own build calls both (top-level CMakeLists.txt) and so does the installed package config.
function(olmax_find_onednn)
  set(olmax_onednn_FOUND FALSE PARENT_SCOPE)
  if(TARGET DNNL::dnnl)
    set(olmax_onednn_FOUND TRUE PARENT_SCOPE)
    set(olmax_onednn_VERSION "" PARENT_SCOPE)
    return()
  endif()
  find_path(OLMAX_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp DOC "Folder containing oneapi/dnnl/dnnl.hpp (oneDNN 2.x or 3.x; enables olmax::onednn)")
  find_library(OLMAX_ONEDNN_LIBRARY dnnl DOC "oneDNN's library libdnnl (enables olmax::onednn)")
  if(NOT OLMAX_ONEDNN_INCLUDE_DIR OR NOT OLMAX_ONEDNN_LIBRARY)
    return()
  endif()
  file(STRINGS "${OLMAX_ONEDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" versions REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "DNNL_VERSION_${part} ([0-9]+)" match "${versions}")
    list(APPEND version "${CMAKE_MATCH_1}")
  endforeach()
  string(REPLACE ";" "." version "${version}")
  set(olmax_onednn_VERSION "${version}" PARENT_SCOPE)
  # onednn_gemm.hpp speaks the 2.x and 3.x APIs (3.0 removed operation descriptors and output scales).
  if(NOT version MATCHES "^[23]\\.")
    message(STATUS "olmax: oneDNN ${version} at ${OLMAX_ONEDNN_INCLUDE_DIR} is neither 2.x nor 3.x: olmax::onednn not defined")
    return()
  endif()
  set(olmax_onednn_FOUND TRUE PARENT_SCOPE)
endfunction()

function(olmax_define_onednn_target)
  if(TARGET olmax::onednn)
    return()
  endif()
  add_library(olmax_onednn INTERFACE IMPORTED GLOBAL)
  add_library(olmax::onednn ALIAS olmax_onednn)
  # Code that links the target knows it (olmax/train/precision.hpp: the Trainer's GEMMs on oneDNN).
  target_compile_definitions(olmax_onednn INTERFACE OLMAX_HAS_ONEDNN)
  if(TARGET DNNL::dnnl)
    target_link_libraries(olmax_onednn INTERFACE olmax::olmax DNNL::dnnl)
  else()
    if(NOT OLMAX_ONEDNN_INCLUDE_DIR OR NOT OLMAX_ONEDNN_LIBRARY)
      message(FATAL_ERROR "olmax: olmax_define_onednn_target() needs oneDNN (call olmax_find_onednn() first)")
    endif()
    target_include_directories(olmax_onednn SYSTEM INTERFACE "${OLMAX_ONEDNN_INCLUDE_DIR}")
    target_link_libraries(olmax_onednn INTERFACE olmax::olmax "${OLMAX_ONEDNN_LIBRARY}")
  endif()
endfunction()
