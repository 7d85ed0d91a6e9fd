# olmax::distributed: what code that includes olmax/distributed/gloo.hpp (the Gloo communicator)
# links. Like the rest of olmax it is header-only, but it needs Gloo's headers and libgloo (Debian:
# libgloo-dev, whose GlooConfig.cmake defines the imported target `gloo`). The core library and
# olmax/distributed/communicator.hpp / data_parallel.hpp need none of it.
#
# olmax_define_distributed_target() defines the target once `find_package(Gloo CONFIG)` found Gloo;
# olmax's own build calls it (top-level CMakeLists.txt) and so does the installed package config.
function(olmax_define_distributed_target)
  if(TARGET olmax::distributed)
    return()
  endif()
  if(NOT TARGET gloo)
    message(FATAL_ERROR "olmax: olmax_define_distributed_target() needs Gloo's imported target `gloo` (find_package(Gloo CONFIG))")
  endif()
  find_package(Threads REQUIRED)  # Gloo's TCP transport runs its own event-loop thread
  add_library(olmax_distributed INTERFACE IMPORTED GLOBAL)
  add_library(olmax::distributed ALIAS olmax_distributed)
  target_link_libraries(olmax_distributed INTERFACE olmax::olmax gloo Threads::Threads)
endfunction()
