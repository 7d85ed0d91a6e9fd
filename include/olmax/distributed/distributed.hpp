#pragma once
// Training across processes: the Communicator interface (world of one: LocalCommunicator) and the
// gradient allreduce / parameter broadcast built on it. The communicators between processes need
// their libraries and are included on their own: olmax/distributed/gloo.hpp (Gloo, CMake target
// olmax::distributed) and olmax/distributed/mpi.hpp (MPI, CMake target olmax::distributed_mpi).

#include "olmax/distributed/communicator.hpp"
#include "olmax/distributed/data_parallel.hpp"
