// Trains a byte-level language model (olmax::models::ByteLM over the recipe --block) on real text, in
// one process or several (--world_size / --rank / --rendezvous), on the CPU or compiled for a PJRT
// device (--device=xla); docs/TRAIN_LM.md. The library runs it (train::launch: threads, --device's
// step, the processes; train::Trainer: the loop at --precision); this file holds the flags and the
// printing: a progress bar (log lines when stdout is not a terminal), held-out losses, metrics.csv and
// loss.png in --checkpoint_dir, samples at the end. Exit status: 0 done, 1 failure, 2 bad usage (flags,
// or ranks started with settings that disagree), 3 diverged (NaN/Inf; the last good checkpoint is kept),
// 130 / 143 stopped by SIGINT / SIGTERM after the step and a checkpoint (all ranks; a 2nd SIGINT at once, without).
//     build/examples/train_lm --data=notes/ --steps=2000 --preset=small --block=mamba
//     bash tools/launch_local.sh 2 build/examples/train_lm   # 2 processes on this machine

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include <olmax/olmax.hpp>
#include <olmax/train/launch.hpp>  // with the targets olmax::pjrt / olmax::distributed: --device=xla, --world_size > 1

namespace {

const auto program_start = std::chrono::steady_clock::now();  // the summary's wall time counts from here

namespace config = olmax::config;
namespace models = olmax::models;
namespace train = olmax::train;

/// The Trainer's reports on rank 0's stdout (the other ranks print to a null stream).
struct Printer final : train::Observer {
    std::ostream& out;
    const bool interactive;  // a progress bar on a terminal, else a log line every log_every steps
    const std::int64_t log_every;
    const double baseline;
    std::optional<olmax::io::ProgressBar> bar;
    Printer(std::ostream& o, bool i, std::int64_t every, double b) : out(o), interactive(i), log_every(every), baseline(b) {}
    void note(std::string_view line) override { bar ? bar->message(std::string(line)) : void(out << line << "\n"); }
    void warning(std::string_view line) override { std::cerr << line << "\n"; }
    void started(std::int64_t first, std::int64_t total) override { bar.emplace(out, total, interactive, log_every, first); }
    void evaluated(std::int64_t step, double loss) override {
        char line[160];
        std::snprintf(line, sizeof line, "step %lld: held-out loss %.4f nats/byte (%.3f bits/byte; unigram %.4f)", static_cast<long long>(step),
                      loss, loss / std::log(2.0), baseline);
        note(line);
    }
    void finished() override { bar->finish(); }
    void step_finished(const train::StepReport& r) override {
        char extra[64];  // "eval -" until the first held-out loss exists
        if (std::isnan(r.last_evaluation)) std::snprintf(extra, sizeof extra, "lr %.2e  eval -", r.learning_rate);
        else std::snprintf(extra, sizeof extra, "lr %.2e  eval %.3f", r.learning_rate, r.last_evaluation);
        bar->update(r.step, r.loss, r.tokens_this_run, extra, r.budget_seconds_left);  // the ETA: the sooner of steps and budget
    }
};

template <class Recipe, class Model = models::ByteLM<Recipe>>
int train_model(const train::TrainConfig& c, olmax::distributed::Communicator& comm, std::unique_ptr<train::StepStrategy<Model>> step) {
    const bool lead = comm.rank() == 0;  // rank 0 prints, writes checkpoints and metrics
    std::ostream null_out(nullptr);      // the other ranks' progress goes nowhere (errors still reach stderr)
    std::ostream& out = lead ? std::cout : null_out;
    out << "# resolved config\n" << config::to_text(c) << std::flush;
    const auto rank = comm.rank(), ranks = comm.world_size();
    if (ranks > 1)
        std::cout << "rank " << rank << " of " << ranks << " (" << comm.backend_name() << "): rows " << c.batch * rank / ranks << ".."
                  << c.batch * (rank + 1) / ranks - 1 << " of each batch\n" << std::flush;
    auto text = train::read_text_data(c.data, c.held_out_fraction, std::uint64_t(c.seed));
    for (const auto& line : text.report) out << line << "\n";
    Model model(models::ByteLMConfig::from(c));  // checked in run()
    const std::int64_t kept_layers = c.device == "xla" ? std::max<std::int64_t>(c.kept_layers, 0) : c.kept_layers;  // on XLA only when asked (docs/xla.md)
    const std::size_t kept = model.keep_activations(kept_layers, std::size_t(c.batch / ranks), std::size_t(c.sequence), train::shards_for(c));
    if (kept > 0) out << "recompute: the first " << kept << " of " << c.depth << " blocks keep their activations" << (c.kept_layers < 0 ? " (as many as fit half the free memory; --kept_layers=0: none)" : "") << "\n";
    olmax::optim::AdamW<typename Model::value_type> opt(model.parameters(), train::optimizer_config(c));
    out << "model: " << c.depth << " x " << Recipe::description << ", " << c.features << " features, " << olmax::nn::parameter_count(model) << " parameters\n";
    Printer printer(out, lead && olmax::io::stdout_is_terminal(), c.log_every, text.unigram_baseline);
    train::Trainer trainer(model, opt, comm, std::move(text.train), std::move(text.held_out), train::trainer_options(c), std::move(step), printer);
    try {
        trainer.prepare();  // resume, the ranks' agreement, rank 0's parameters everywhere, the step compiled
    } catch (const olmax::distributed::disagreement_error& e) {  // ranks started differently stop here, all with the same line
        return std::cerr << "train_lm: " << e.what() << std::endl, config::exit_usage;
    }
    if (c.dry_run) return out << "dry run: flags, data, model" << (trainer.step() > 0 ? " and checkpoint" : "") << " are fine; not training\n", 0;
    train::TrainResult r;
    try {
        r = trainer.run();
    } catch (const train::training_diverged& e) {  // exit status 3
        printer.note(std::string("training diverged: ") + e.what());
        return printer.note(e.last_checkpoint().empty() ? "no checkpoint was written in this run" : "the last good checkpoint is " + e.last_checkpoint().string()), 3;
    }
    char line[400];
    // Rank 0's; the exchange share is what training across processes costs per step; --time_budget_s counts the step seconds.
    std::snprintf(line, sizeof line, "trained %.0f tokens in %.2f s of training steps (%.0f tokens/s, %.3f ms/step); gradient exchange "
                  "%.2f s (%.1f%%) across %d process(es)\nwall time %.1f s: the steps plus reading the data, building the model, "
                  "evaluations and checkpoints (the loss plot and samples follow)\n", r.tokens_this_run, r.train_seconds,
                  r.tokens_per_second(), r.milliseconds_per_step(), r.exchange_seconds,
                  r.train_seconds > 0 ? 100 * r.exchange_seconds / r.train_seconds : 0.0, ranks,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - program_start).count());
    out << line << (r.step_summary.empty() ? "" : r.step_summary + "\n");
    const std::string checkpoint = r.last_checkpoint.empty() ? std::string("(none written in this run)") : r.last_checkpoint.string();
    if (r.stop.stop) {  // every rank reports; rank 0 wrote the checkpoint. No loss curve, no samples: stop soon.
        const std::string stopped = "stopped by " + olmax::signal_name(r.stop.signal) + " after step " + std::to_string(r.step);
        std::cout << (lead ? stopped + "; checkpoint: " + checkpoint + " (the same command resumes from it)"
                           : "rank " + std::to_string(rank) + ": " + stopped + " together with the other ranks (rank 0 wrote the checkpoint)") << std::endl;
        return r.stop.exit_status();
    }
    if (!lead) return 0;  // the rest (loss curve, samples) is rank 0's
    std::cout << "checkpoint: " << checkpoint << "\n";
    // scripts/plot_loss.py beside this file (CMake compiles absolute paths), the executable (<repo>/build/examples/) or here.
    std::error_code no_exe;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", no_exe);
    auto script = std::filesystem::path(__FILE__).parent_path().parent_path() / "scripts/plot_loss.py";
    for (const auto& candidate : {exe.parent_path().parent_path().parent_path() / "scripts/plot_loss.py", std::filesystem::path("scripts/plot_loss.py")})
        if (!std::filesystem::exists(script)) script = candidate;
    const auto png = std::filesystem::path(c.checkpoint_dir) / "loss.png";
    const std::string plot = "/usr/bin/python3 '" + script.string() + "' '" + trainer.metrics_path().string() + "' -o '" + png.string() +
                             "' --baseline " + std::to_string(text.unigram_baseline);
    if (c.plot)
        std::cout << (std::filesystem::exists(script) && std::filesystem::exists("/usr/bin/python3") && std::system((plot + " > /dev/null").c_str()) == 0
                          ? "loss curve: " + png.string() : "loss curve not drawn; run: " + plot) << "\n";
    olmax::Generator sampler(std::uint64_t(c.seed) + 1);
    const olmax::data::SamplingConfig sampling{c.temperature, std::size_t(c.top_k), c.top_p};
    for (int i = 0; i < 2 && c.sample_bytes > 0; ++i)  // at the run's precision, as it trained
        std::cout << "\n--- sample " << i + 1 << " (temperature " << c.temperature << ", top_p " << c.top_p << ") ---\n" << c.prompt
                  << trainer.with_precision([&] { return model.sample(c.prompt, std::size_t(c.sample_bytes), std::size_t(c.sequence), sampling, sampler, olmax::train::decoding(c)); }) << "\n";
    return 0;
}

int run(int argc, char** argv) {
    train::TrainConfig c;
    const auto cl = train::parse_train_command_line(c, argc, argv);
    if (cl.help)
        return std::cout << "usage: train_lm [--config=FILE] [--key=value ...]\n\n" << config::help_text<train::TrainConfig>()
                         << "\nexit status: 0 done, 1 failure, 2 usage error (or ranks that disagree), 3 training diverged, 130 / 143 "
                            "stopped by SIGINT / SIGTERM (after the current step and a checkpoint)\n", 0;
    olmax::stop_on_signals stop("train_lm", "finishing the current step, then writing a checkpoint");  // from here on
    olmax::check<config::config_error>(cl.positional.empty(), "unexpected argument '", cl.positional.empty() ? "" : cl.positional[0],
                                       "' (flags are --key=value)");
    c.validate();
    return models::with_recipe(c.block, [&]<class Recipe>() {
        using Model = models::ByteLM<Recipe>;  // fp32
        Model::check_trainable(models::ByteLMConfig::from(c), std::size_t(c.batch), std::size_t(c.sequence));  // before any work
        auto launched = train::launch<Model>(c);  // threads, the step of --device (refusals first), then the processes
        return train_model<Recipe>(c, *launched.comm, std::move(launched.step));
    });
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("train_lm", run, argc, argv); }
