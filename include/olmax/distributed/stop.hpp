#pragma once
// Stopping together. Ranks that train in lockstep must leave their loop after the same step: a
// rank that stops alone leaves the others waiting in their next collective until it times out,
// and the checkpoint it may have written misses their last step. A signal, though, reaches one
// rank (SIGTERM to one process of a job), some, or all of them at slightly different moments. So
// at every step boundary the ranks add their votes (olmax/core/stop.hpp: has this rank been asked
// to stop?) in one allreduce, and all of them read the same decision from the sums:
//
//     olmax::stop_on_signals stop("my_trainer");
//     for (...) {
//         step();
//         const auto decision = dist::agree_to_stop(comm);   // every rank, at the same point
//         if (decision.stop) { if (comm.rank() == 0) save(); return decision.exit_status(); }
//     }
//
// A loop that already makes a small allreduce per step (a loss, a flag) appends `stop_vote()` to
// it and reads `decide_stop` from the sums instead: no collective more per step (train_lm does).
//
// The decision names one signal for all ranks: SIGTERM if any rank received it, else SIGINT if any
// did, else none (a stop requested by the program itself). Every rank, asked or not, then exits
// with the same status, 128 + that signal (the status of a process the signal had killed, so
// that shells and schedulers read it as "interrupted"), or 0 without a signal.

#include <array>
#include <csignal>
#include <cstddef>
#include <optional>
#include <span>

#include "olmax/core/error.hpp"
#include "olmax/core/stop.hpp"
#include "olmax/distributed/communicator.hpp"

namespace olmax::distributed {

/// Doubles of one rank's vote: [received SIGTERM, received SIGINT, asked without either], 0 or 1.
inline constexpr std::size_t stop_vote_size = 3;

struct StopDecision {
    bool stop = false;  // some rank was asked to stop: every rank stops here
    int signal = 0;     // SIGTERM if any rank received it, else SIGINT if any did, else 0
    int ranks = 0;      // how many ranks were asked
    /// 128 + signal (130 for SIGINT, 143 for SIGTERM), 0 without a signal.
    int exit_status() const { return signal > 0 ? 128 + signal : 0; }
};

/// This rank's vote, from olmax::stop_signal() and olmax::stop_requested().
inline std::array<double, stop_vote_size> stop_vote() {
    std::array<double, stop_vote_size> vote{0, 0, 0};
    if (!stop_requested()) return vote;
    const int signal = stop_signal();
    vote[signal == SIGTERM ? 0 : signal == SIGINT ? 1 : 2] = 1;
    return vote;
}

/// The decision from the votes added over all ranks (an allreduce sum of every rank's stop_vote()).
inline StopDecision decide_stop(std::span<const double> summed) {
    check(summed.size() == stop_vote_size, "decide_stop: expected ", stop_vote_size, " summed votes, got ", summed.size());
    StopDecision d;
    d.ranks = int(summed[0] + summed[1] + summed[2]);
    d.stop = d.ranks > 0;
    d.signal = summed[0] > 0 ? SIGTERM : summed[1] > 0 ? SIGINT : 0;
    return d;
}

/// Whether the ranks stop here: one allreduce of `stop_vote_size` doubles. Every rank must call it
/// at the same point of its loop (it is a collective).
inline StopDecision agree_to_stop(Communicator& comm, std::optional<Timeout> timeout = {}) {
    auto vote = stop_vote();
    comm.allreduce(std::span<double>(vote), Reduction::sum, timeout);
    return decide_stop(vote);
}

}  // namespace olmax::distributed
