#pragma once
// Training across processes: the Communicator interface (world of one: LocalCommunicator) and the
// gradient allreduce / parameter broadcast built on it. The Gloo communicator needs Gloo and is
// included on its own: olmax/distributed/gloo.hpp (CMake target olmax::distributed).

#include "olmax/distributed/communicator.hpp"
#include "olmax/distributed/data_parallel.hpp"
