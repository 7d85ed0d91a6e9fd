#pragma once
// Training across processes: the Communicator interface (world of one: LocalCommunicator), the
// gradient allreduce / parameter broadcast built on it, the ranks' agreement on their settings
// (check_agreement) and on stopping (agree_to_stop). The communicators between processes need
// their libraries and are included on their own: olmax/distributed/gloo.hpp (Gloo, CMake target
// olmax::distributed) and olmax/distributed/mpi.hpp (MPI, CMake target olmax::distributed_mpi).

#include "olmax/distributed/agreement.hpp"
#include "olmax/distributed/communicator.hpp"
#include "olmax/distributed/data_parallel.hpp"
#include "olmax/distributed/stop.hpp"
