#pragma once
// How a Trainer reports: it calls an Observer and prints nothing itself, so the program decides
// what goes to the terminal, a log or nowhere (examples/train_lm.cpp draws a progress bar).

#include <cstdint>
#include <limits>
#include <string_view>

namespace olmax::train {

/// One finished optimiser step.
struct StepReport {
    std::int64_t step = 0;          ///< steps done, counting those before a resume
    std::int64_t total_steps = 0;   ///< the run's target
    double loss = 0;                ///< the step's training loss (mean over micro-batches and ranks)
    double tokens_this_run = 0;     ///< tokens trained since this process started (not before a resume)
    double learning_rate = 0;       ///< the schedule's rate for the next step
    double last_evaluation = 0;     ///< the latest held-out loss (NaN before the first evaluation)
    /// Seconds of training steps left in the run's time budget (what TrainerOptions::time_budget_s
    /// counts: steps only, not evaluations or checkpoints); infinity when there is no budget.
    double budget_seconds_left = std::numeric_limits<double>::infinity();
};

/// The Trainer's reports; every member has a default that ignores it. Called on every rank (a
/// program that prints on rank 0 only gives the others a silent observer).
class Observer {
public:
    virtual ~Observer() = default;
    /// A line of news: a resumed checkpoint, a skipped damaged one, the compiled step, a note.
    virtual void note(std::string_view /*line*/) {}
    /// A line for the error stream: a checkpoint rejected while resuming.
    virtual void warning(std::string_view /*line*/) {}
    /// The loop starts at `first_step` (after a resume: the checkpoint's step).
    virtual void started(std::int64_t /*first_step*/, std::int64_t /*total_steps*/) {}
    virtual void step_finished(const StepReport& /*report*/) {}
    /// The held-out loss (nats per target) after `step`.
    virtual void evaluated(std::int64_t /*step*/, double /*held_out_loss*/) {}
    /// The loop has ended (its last step, the time budget or a stop); notes may follow.
    virtual void finished() {}
};

}  // namespace olmax::train
