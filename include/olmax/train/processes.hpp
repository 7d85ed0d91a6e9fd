#pragma once
// The keys of a program's config that place it among the processes training together (data
// parallel across processes: distributed::Communicator, Gloo's rendezvous).

#include <cstdint>
#include <string>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"

namespace olmax::train {

struct ProcessConfig {
    std::int64_t world_size = 1;
    std::int64_t rank = 0;
    std::string rendezvous;  // file:DIR or tcp:HOST:PORT
    double collective_timeout_s = 120;

    static const std::vector<config::Field<ProcessConfig>>& fields() {
        using C = ProcessConfig;
        using config::Field;
        static const std::vector<Field<C>> f{
            Field<C>{"world_size", &C::world_size, "processes training together (data parallel; each takes batch / world_size rows)"}
                .in(1, 1 << 16),
            Field<C>{"rank", &C::rank, "this process's rank in [0, world_size); rank 0 writes checkpoints and metrics"}.in(0, 1 << 16),
            Field<C>{"rendezvous", &C::rendezvous, "how the processes find each other: file:DIR (a folder all can reach) or "
                                                   "tcp:HOST:PORT (rank 0 listens there)"},
            Field<C>{"collective_timeout_s", &C::collective_timeout_s, "a peer silent this long is an error (rendezvous and every "
                                                                       "gradient exchange)"}.greater_than(0).at_most(1e6),
        };
        return f;
    }

    void validate() const {
        config::validate_fields(*this);
        check<config::config_error>(rank < world_size, "config: key 'rank' (", rank, ") must be below 'world_size' (", world_size, ")");
        check<config::config_error>(world_size == 1 || !rendezvous.empty(), "config: world_size ", world_size,
                                    " needs --rendezvous=file:DIR or --rendezvous=tcp:HOST:PORT");
    }
};

}  // namespace olmax::train
