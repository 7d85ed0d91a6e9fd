#pragma once
// The training loop of a model (train::TrainableModel): resume from the newest checkpoint (rank
// 0's, shared with the other ranks, after they agree on the run), steps by a step strategy
// (host_step.hpp, xla_step.hpp), held-out evaluations, checkpoints, metrics.csv, divergence, stop
// on signals (all ranks after the same step) and the time budget. It prints nothing: it reports to
// a train::Observer. It runs at the precision and with the OpenMP threads of its options
// (TrainerOptions::precision, ::threads; olmax/train/precision.hpp): bf16 GEMMs on oneDNN's kernels
// where the program links olmax::onednn, on the portable ones otherwise.
//
//     train::Trainer trainer(model, optimizer, comm, std::move(split.train), std::move(split.held_out), options,
//                            std::make_unique<train::HostStep<Model>>(train::HostStepOptions{}), observer);
//     trainer.prepare();               // resume, agreement, broadcast, step strategy ready
//     const auto result = trainer.run();

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/data/loader.hpp"
#include "olmax/distributed/data_parallel.hpp"
#include "olmax/distributed/stop.hpp"
#include "olmax/io/checkpoint.hpp"
#include "olmax/io/progress.hpp"
#include "olmax/optim/adam.hpp"
#include "olmax/train/agreement.hpp"
#include "olmax/train/evaluation.hpp"
#include "olmax/train/model.hpp"
#include "olmax/train/observer.hpp"
#include "olmax/train/precision.hpp"
#include "olmax/train/step.hpp"

namespace olmax::train {

/// The loop's keys of a program's config: length, evaluation and checkpoint cadence, resume, time budget.
struct LoopConfig {
    std::int64_t steps = 10000;            ///< optimiser steps in all, counting those before a resume
    std::int64_t eval_every = 250;         ///< steps between held-out evaluations (and one after the last step)
    std::int64_t eval_batches = 16;        ///< held-out batches per evaluation
    std::int64_t checkpoint_every = 500;   ///< steps between checkpoints (and one after the last step)
    std::string checkpoint_dir = "runs/train_lm";  ///< checkpoints and metrics.csv (rank 0 writes them)
    std::int64_t keep_checkpoints = 3;
    bool resume = true;         ///< continue from the newest valid checkpoint; false refuses a folder that has some
    double time_budget_s = 0;   ///< stop after the step that reaches this many seconds of steps (0: off)

    static const std::vector<config::Field<LoopConfig>>& fields() {
        using C = LoopConfig;
        using config::Field;
        constexpr double steps_max = 1e12;
        static const std::vector<Field<C>> f{
            Field<C>{"steps", &C::steps, "optimiser steps"}.in(1, steps_max),
            Field<C>{"eval_every", &C::eval_every, "steps between held-out evaluations"}.in(1, steps_max),
            Field<C>{"eval_batches", &C::eval_batches, "held-out batches per evaluation"}.in(1, 1 << 20),
            Field<C>{"checkpoint_every", &C::checkpoint_every, "steps between checkpoints"}.in(1, steps_max),
            Field<C>{"checkpoint_dir", &C::checkpoint_dir, "folder for checkpoints, metrics.csv and loss.png"}.names(config::PathKind::output_folder),
            Field<C>{"keep_checkpoints", &C::keep_checkpoints, "checkpoints kept in checkpoint_dir"}.in(1, 1000),
            Field<C>{"resume", &C::resume, "continue from the newest valid checkpoint in checkpoint_dir"},
            Field<C>{"time_budget_s", &C::time_budget_s, "stop after the step that reaches this many seconds of training (0: off), "
                                                         "then evaluate and checkpoint"}.in(0, 1e9),
        };
        return f;
    }
};

/// The Trainer's settings: the loop's keys, the batch, how it computes, and what identifies the run.
struct TrainerOptions : LoopConfig {
    std::size_t batch = 8, sequence = 64;  ///< rows of the global batch, targets per row
    std::uint64_t seed = 0;                ///< data order
    /// fp32 or bf16: the GEMM kernels run() trains and evaluates with (train::PrecisionScope:
    /// oneDNN's where the program links olmax::onednn, fp32 included; the portable ones otherwise).
    std::string precision = "fp32";
    std::int64_t threads = 0;              ///< OpenMP threads, set by prepare(); 0: left as they are
    /// The run's resolved settings as `key = value` lines: stored in every checkpoint
    /// ("train/config") and compared across the ranks, but for `rank_local_keys`.
    std::string config_text;
    std::vector<std::string> rank_local_keys;
    /// Called with the resumed checkpoint's config text before its state is restored: throws to
    /// refuse it (another model, say), returns a note to report or "".
    std::function<std::string(std::string_view saved_config)> check_resumed_config;
};

/// A step's loss or gradient was NaN or Inf; the state from the last checkpoint is intact there.
class training_diverged : public optim::non_finite_gradient {
public:
    training_diverged(const std::string& what, std::filesystem::path last_checkpoint)
        : optim::non_finite_gradient(what), last_checkpoint_(std::move(last_checkpoint)) {}
    /// The checkpoint this run wrote last (empty: none).
    const std::filesystem::path& last_checkpoint() const { return last_checkpoint_; }

private:
    std::filesystem::path last_checkpoint_;
};

/// How a run ended (other than by an exception).
struct TrainResult {
    std::int64_t step = 0;              ///< steps done, counting those before a resume
    double tokens_this_run = 0;
    double tokens_per_step = 0;
    double train_seconds = 0;           ///< the steps only: no evaluations, checkpoints or reports
    double exchange_seconds = 0;        ///< of which exchanging gradients and the loss between ranks
    double last_evaluation = std::nan("");
    bool out_of_time = false;           ///< the time budget ended the run
    distributed::StopDecision stop;     ///< a signal ended the run (no final evaluation then)
    std::filesystem::path last_checkpoint;  ///< written by this run (empty: none)
    std::string step_summary;           ///< the step strategy's line for the summary, or ""

    double tokens_per_second() const { return train_seconds > 0 ? tokens_this_run / train_seconds : 0.0; }
    double milliseconds_per_step() const { return tokens_this_run > 0 ? 1e3 * train_seconds * tokens_per_step / tokens_this_run : 0.0; }
};

template <TrainableModel Model>
class Trainer {
public:
    using T = typename Model::value_type;

    /// `train` and `held_out`: the documents trained on and evaluated on. `step`: how each step is
    /// computed. `observer` must outlive the Trainer.
    Trainer(Model& model, optim::AdamW<T>& optimizer, distributed::Communicator& comm, data::Documents train, data::Documents held_out,
            TrainerOptions options, std::unique_ptr<StepStrategy<Model>> step, Observer& observer)
        : model_(model), optimizer_(optimizer), comm_(comm), options_(std::move(options)), step_(std::move(step)), observer_(observer),
          held_out_(std::move(held_out)), train_digest_(documents_digest(train)),
          loader_(std::move(train), {options_.batch, options_.sequence, options_.seed, true, true}) {
        check<value_error>(step_ != nullptr, "train::Trainer: no step strategy");
        const auto positive = [](std::int64_t v) { return v >= 1; };
        check<value_error>(positive(options_.steps) && positive(options_.eval_every) && positive(options_.eval_batches) &&
                               positive(options_.checkpoint_every) && positive(options_.keep_checkpoints),
                           "train::Trainer: steps, eval_every, eval_batches, checkpoint_every and keep_checkpoints must be at least 1");
        check<value_error>(options_.batch % std::size_t(comm_.world_size()) == 0, "train::Trainer: a batch of ", options_.batch,
                           " rows does not split into ", comm_.world_size(), " equal shares, one per rank");
        check<value_error>(std::isfinite(options_.time_budget_s) && options_.time_budget_s >= 0,
                           "train::Trainer: time_budget_s must be 0 (off) or positive, got ", options_.time_budget_s);
        check<value_error>(!held_out_.empty(), "train::Trainer: no held-out documents to evaluate on");
        check<value_error>(options_.precision == "fp32" || options_.precision == "bf16",
                           "train::Trainer: precision must be fp32 or bf16, got '", options_.precision, "'");
        check<value_error>(options_.threads >= 0, "train::Trainer: threads must be 0 (as they are) or positive, got ", options_.threads);
    }

    /// Sets the OpenMP threads (options' `threads`), resumes from the newest loadable checkpoint in
    /// the folder (rank 0 reads it and shares it), checks that every rank runs the same settings,
    /// data and model (distributed::disagreement_error otherwise), gives every rank rank 0's
    /// parameters and prepares the step strategy. Returns the step training starts after. A collective.
    std::int64_t prepare() {
        check(!prepared_, "train::Trainer::prepare: called twice");
        set_threads(options_.threads);  // before the step strategy counts its shards
        const auto resumed = share_checkpoint(comm_, [&] { return load_checkpoint(); });
        distributed::check_agreement(comm_, run_fingerprint(options_.config_text, options_.rank_local_keys,
                                                            std::int64_t(options_.batch) / comm_.world_size(), train_digest_,
                                                            optimizer_.parameters(), resumed ? resumed->integer("train/step") : 0));
        if (resumed) {
            // The checkpoint's config is checked (a refusal throws) before anything says it resumed.
            const std::string note = options_.check_resumed_config ? options_.check_resumed_config(resumed->text("train/config")) : "";
            const auto state = io::restore_checkpoint(*resumed, optimizer_);
            loader_.restore(data::DataPosition::from_text(state.data_position));
            step_count_ = state.step;
            observer_.note("resumed from " + (resumed_from_.empty() ? std::string("rank 0's checkpoint") : resumed_from_.string()) +
                           " at step " + std::to_string(step_count_));
            if (!note.empty()) observer_.note(note);
        }
        optimizer_.set_progress(double(step_count_) / double(options_.steps));  // a resumed cosine / linear schedule goes on where it was
        distributed::broadcast_parameters(comm_, distributed::tensors_of(optimizer_.parameters()));  // every rank starts from rank 0's values
        const std::string line = step_->prepare({model_, optimizer_, comm_});  // after the resume: it may copy the host state
        if (!line.empty()) observer_.note(line);
        prepared_ = true;
        return step_count_;
    }

    /// Trains until `steps`, the time budget or a stop signal (SIGINT/SIGTERM on any rank), with
    /// evaluations and checkpoints on their cadence and after the last step (no evaluation after a
    /// stop: a scheduler's grace period is short). Throws training_diverged on a NaN/Inf loss or
    /// gradient. Trains and evaluates inside the precision's PrecisionScope (reporting its note,
    /// "precision bf16: GEMMs on ...", first). A collective.
    TrainResult run() {
        if (!prepared_) prepare();
        const PrecisionScope precision(options_.precision);
        if (!precision.note().empty()) observer_.note(precision.note());
        const bool lead = comm_.rank() == 0;  // rank 0 writes checkpoints and metrics
        std::optional<io::MetricsLog> metrics;
        if (lead) {
            std::filesystem::create_directories(options_.checkpoint_dir);
            metrics.emplace(metrics_path(), step_count_ > 0);
        }
        TrainResult r;
        r.tokens_per_step = double(options_.batch * options_.sequence) * double(step_->micro_batches());
        using clock = std::chrono::steady_clock;
        auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
        const auto next_batch = [&] { return *loader_.next(); };
        observer_.started(step_count_, options_.steps);
        while (step_count_ < options_.steps && !r.out_of_time && !r.stop.stop) {
            const auto step_started = clock::now();
            double loss = 0;
            try {
                const StepLoss local = step_->compute(next_batch);
                // The batch's loss (mean over ranks), rank 0's verdict on the time budget and every
                // rank's stop vote (a signal received), in one exchange.
                const auto exchange_started = clock::now();
                const double elapsed = r.train_seconds + seconds_since(step_started);
                const auto vote = distributed::stop_vote();
                std::array<double, 3 + distributed::stop_vote_size> shared{
                    local.loss, lead && options_.time_budget_s > 0 && elapsed >= options_.time_budget_s ? 1.0 : 0.0,
                    lead && options_.time_budget_s > 0 ? elapsed / options_.time_budget_s : 0.0};
                std::copy(vote.begin(), vote.end(), shared.begin() + 3);
                comm_.allreduce(std::span<double>(shared));
                const double budget_fraction = shared[2];
                r.exchange_seconds += local.exchange_seconds + (comm_.world_size() > 1 ? seconds_since(exchange_started) : 0.0);
                loss = shared[0] / double(comm_.world_size());
                r.out_of_time = shared[1] > 0;
                r.stop = distributed::decide_stop(std::span<const double>(shared).subspan(3));
                const bool finite_norm = !local.grad_norm || std::isfinite(*local.grad_norm);
                if (!std::isfinite(loss) || !finite_norm) {
                    std::string what = olmax::detail::concat("the loss is ", loss);
                    if (local.grad_norm) what += olmax::detail::concat(" and the gradient norm ", *local.grad_norm);
                    what += olmax::detail::concat(" at step ", step_count_ + 1);
                    if (const auto note = step_->divergence_note(); !note.empty()) what += " " + note;
                    throw optim::non_finite_gradient(what);
                }
                step_->update();
                // Cosine and linear schedules decay over the run: the next step's learning rate
                // follows the larger of the steps' and the time budget's fraction (rank 0's clock,
                // shared above, so every rank uses the same rate).
                optimizer_.set_progress(std::max(double(step_count_ + 1) / double(options_.steps), shared[1] > 0 ? 1.0 : budget_fraction));
            } catch (const optim::non_finite_gradient& e) {  // from the check above, AdamW's own, or backward's
                throw training_diverged(e.what(), r.last_checkpoint);
            }
            r.train_seconds += seconds_since(step_started);
            ++step_count_;
            r.tokens_this_run += r.tokens_per_step;
            const double tokens_total = double(step_count_) * r.tokens_per_step;
            if (metrics) metrics->write(step_count_, tokens_total, "train", loss);
            const bool last = step_count_ == options_.steps || r.out_of_time || r.stop.stop;
            if (step_count_ % options_.eval_every == 0 || (last && !r.stop.stop)) {
                r.last_evaluation = evaluate_held_out();
                if (metrics) metrics->write(step_count_, tokens_total, "eval", r.last_evaluation);
                observer_.evaluated(step_count_, r.last_evaluation);
            }
            if (lead && (step_count_ % options_.checkpoint_every == 0 || last))
                r.last_checkpoint = save_checkpoint("train loss " + std::to_string(loss));
            const double budget_left = options_.time_budget_s > 0 ? std::max(0.0, options_.time_budget_s - r.train_seconds)
                                                                  : std::numeric_limits<double>::infinity();
            observer_.step_finished({step_count_, options_.steps, loss, r.tokens_this_run, optimizer_.next_lr(),
                                     r.last_evaluation, r.out_of_time ? 0.0 : budget_left});
        }
        r.step = step_count_;
        r.step_summary = step_->summary();
        observer_.finished();
        if (r.out_of_time) {
            char line[128];
            std::snprintf(line, sizeof line, "time budget of %.0f s reached after step %lld", options_.time_budget_s, static_cast<long long>(step_count_));
            observer_.note(line);
        }
        return r;
    }

    /// The held-out loss now, at the run's precision (a collective).
    double evaluate_now() {
        return with_precision([&] { return evaluate_held_out(); });
    }

    /// f() computed at the run's precision, as run() trains and evaluates (a PrecisionScope of
    /// options' `precision` around it): e.g. samples from the trained model.
    template <class F>
    decltype(auto) with_precision(F&& f) const {
        const PrecisionScope precision(options_.precision);
        return std::forward<F>(f)();
    }

    /// Writes a checkpoint of the current step (rank 0's job) and returns its path.
    std::filesystem::path save_checkpoint(const std::string& note = {}) {
        step_->synchronize_host();
        return checkpoints_.save(
            io::make_checkpoint(optimizer_, io::TrainingState{step_count_, options_.config_text, loader_.position().to_text(), note}),
            step_count_);
    }

    std::int64_t step() const { return step_count_; }
    std::filesystem::path metrics_path() const { return std::filesystem::path(options_.checkpoint_dir) / "metrics.csv"; }
    const TrainerOptions& options() const { return options_; }

private:
    /// The held-out loss now, at whatever precision the caller runs (a collective).
    double evaluate_held_out() {
        step_->synchronize_host();
        return evaluate(model_, held_out_, {options_.batch, options_.sequence, options_.seed, options_.eval_batches}, comm_);
    }

    /// Rank 0's part of the resume: the folder cleaned of interrupted saves, then its newest
    /// checkpoint that loads (damaged newer ones reported and skipped).
    std::optional<io::Archive> load_checkpoint() {
        for (const auto& name : checkpoints_.remove_stale_temporaries())
            observer_.note("removed " + name + " (left by a save that was interrupted)");
        std::vector<std::string> notices;
        const auto existing = checkpoints_.list(&notices);
        for (const auto& notice : notices) observer_.note("checkpoint folder: " + notice);
        // A fresh run must not mix its checkpoints with an earlier run's (the newest step would win).
        check(options_.resume || existing.empty(), options_.checkpoint_dir, " holds ", existing.size(),
              " checkpoints of an earlier run; pass --resume=true to continue it or choose another --checkpoint_dir");
        if (existing.empty()) return std::nullopt;
        std::vector<std::string> rejected;
        auto loaded = checkpoints_.load_latest(existing, &rejected);
        if (!loaded)
            for (const auto& why : rejected) observer_.warning("rejected checkpoint " + why);
        // Training afresh here would mix this run's checkpoints with the damaged ones.
        check<value_error>(loaded.has_value(), "none of the ", existing.size(), " checkpoints in ", options_.checkpoint_dir,
                           " loads (reasons above); remove them or choose another --checkpoint_dir");
        for (const auto& why : loaded->rejected) observer_.note("skipped damaged checkpoint " + why);
        resumed_from_ = loaded->path;  // "resumed from" is said once the resumed config is accepted (prepare)
        return std::move(loaded->archive);
    }

    Model& model_;
    optim::AdamW<T>& optimizer_;
    distributed::Communicator& comm_;
    TrainerOptions options_;
    std::unique_ptr<StepStrategy<Model>> step_;
    Observer& observer_;
    data::Documents held_out_;
    std::string train_digest_;
    data::PackedLoader loader_;
    io::CheckpointDirectory checkpoints_{options_.checkpoint_dir, std::size_t(options_.keep_checkpoints)};
    std::int64_t step_count_ = 0;
    std::filesystem::path resumed_from_;  ///< rank 0: the checkpoint prepare() resumes from
    bool prepared_ = false;
};

/// `Trainer trainer(model, ..., std::make_unique<HostStep<Model>>(...), observer)`: the model's type
/// from the model, whichever strategy type the pointer holds.
template <class Model, class T, class Strategy>
Trainer(Model&, optim::AdamW<T>&, distributed::Communicator&, data::Documents, data::Documents, TrainerOptions, std::unique_ptr<Strategy>,
        Observer&) -> Trainer<Model>;

}  // namespace olmax::train
