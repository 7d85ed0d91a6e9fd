# The optional communicators of olmax/distributed, each an INTERFACE target that code including its
# header links. Like the rest of olmax they are header-only, but they need a collective library:
#
#   olmax::distributed      olmax/distributed/gloo.hpp (GlooCommunicator): Gloo's headers and libgloo
#                           (Debian: libgloo-dev, whose GlooConfig.cmake defines the imported target `gloo`).
#   olmax::distributed_mpi  olmax/distributed/mpi.hpp (MpiCommunicator): MPI's C API (Debian:
#                           libopenmpi-dev; CMake's FindMPI defines MPI::MPI_CXX).
#
# The core library and olmax/distributed/communicator.hpp / data_parallel.hpp need neither.
# olmax_define_distributed_target() defines the first once `find_package(Gloo CONFIG)` found Gloo,
# olmax_define_distributed_mpi_target() the second once `find_package(MPI COMPONENTS CXX)` found
# MPI; olmax's own build calls them (top-level CMakeLists.txt) and so does the installed package config.
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
  # Code that links the target knows it (olmax/train/launch.hpp: world_size > 1 over Gloo).
  target_compile_definitions(olmax_distributed INTERFACE OLMAX_HAS_GLOO)
  target_link_libraries(olmax_distributed INTERFACE olmax::olmax gloo Threads::Threads)
endfunction()

function(olmax_define_distributed_mpi_target)
  if(TARGET olmax::distributed_mpi)
    return()
  endif()
  if(NOT TARGET MPI::MPI_CXX)
    message(FATAL_ERROR "olmax: olmax_define_distributed_mpi_target() needs the imported target MPI::MPI_CXX (find_package(MPI COMPONENTS CXX))")
  endif()
  add_library(olmax_distributed_mpi INTERFACE IMPORTED GLOBAL)
  add_library(olmax::distributed_mpi ALIAS olmax_distributed_mpi)
  # mpi.hpp uses the C API only; these keep mpi.h from pulling in the deprecated C++ bindings.
  target_compile_definitions(olmax_distributed_mpi INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  target_link_libraries(olmax_distributed_mpi INTERFACE olmax::olmax MPI::MPI_CXX)
endfunction()
