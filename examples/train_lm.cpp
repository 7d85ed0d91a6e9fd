// Trains a byte-level reversible conv/mixer language model on real text on the CPU:
//     build/examples/train_lm                      # default corpus: Debian package `fortunes`
//     build/examples/train_lm --data=notes/ --steps=2000 --features=128
//     build/examples/train_lm --help
// Shows a progress bar (plain log lines when stdout is not a terminal), evaluates on held-out
// documents, writes checkpoints (resumed automatically), metrics.csv and loss.png into
// --checkpoint_dir, and prints samples at the end. Exit status (olmax/config/program.hpp): 0 done,
// 1 bad input or another failure, 2 bad usage (flags), 3 training diverged (NaN/Inf; the last good
// checkpoint is kept).

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <olmax/olmax.hpp>

namespace {

namespace config = olmax::config;
namespace data = olmax::data;
namespace io = olmax::io;
namespace models = olmax::models;
namespace optim = olmax::optim;

using Model = models::ByteLM<>;  // the reversible conv/mixer stem (models::ConvMixer), fp32

/// Held-out loss of the model: the first `batches` batches of a fresh one-pass loader (the same
/// bytes every time), in nats per byte over real targets only.
double evaluate(const Model& model, const data::Documents& held_out, const config::TrainConfig& c) {
    data::PackedLoader loader(held_out, {std::size_t(c.batch), std::size_t(c.sequence), std::uint64_t(c.seed), false, false});
    double nll = 0, count = 0;
    for (std::int64_t i = 0; i < c.eval_batches; ++i) {
        auto batch = loader.next();
        if (!batch) break;
        const auto [sum, n] = model.masked_nll(*batch);
        nll += sum;
        count += n;
    }
    return count > 0 ? nll / count : std::nan("");
}

/// Cross-entropy of held-out bytes under the training bytes' frequencies (add-one smoothed): what
/// a model that ignores context achieves.
double unigram_baseline(const data::Documents& train, const data::Documents& held_out) {
    std::vector<double> counts(256, 1.0);
    double total = 256;
    for (const auto& d : train) {
        for (auto b : d) counts[b] += 1;
        counts[data::ByteTokenizer::end_of_document] += 1;
        total += double(d.size()) + 1;
    }
    double nll = 0, n = 0;
    for (const auto& d : held_out) {
        for (auto b : d) nll -= std::log(counts[b] / total);
        nll -= std::log(counts[data::ByteTokenizer::end_of_document] / total);
        n += double(d.size()) + 1;
    }
    return nll / n;
}

int run(int argc, char** argv) {
    config::TrainConfig c;
    const auto cl = config::parse_command_line(c, argc, argv);
    if (cl.help) {
        std::cout << "usage: train_lm [--config=FILE] [--key=value ...]\n\n" << config::help_text<config::TrainConfig>()
                  << "\nexit status: 0 done, 1 failure, 2 usage error, 3 training diverged\n";
        return 0;
    }
    olmax::check<config::config_error>(cl.positional.empty(), "unexpected argument '", cl.positional.empty() ? "" : cl.positional[0],
                                       "' (flags are --key=value)");
    c.validate();
    const auto model_config = models::ByteLMConfig::from(c);
    Model::check_trainable(model_config, std::size_t(c.batch), std::size_t(c.sequence));  // before any work
#if defined(_OPENMP)
    if (c.threads > 0) omp_set_num_threads(int(c.threads));
#endif
    std::cout << "# resolved config\n" << config::to_text(c) << std::flush;

    // ---- data -------------------------------------------------------------------------------
    const std::filesystem::path data_path = c.data.empty() ? data::default_corpus_path() : std::filesystem::path(c.data);
    const auto corpus = data::read_corpus(data_path);
    for (const auto& line : corpus.report()) std::cout << "data: " << line << "\n";
    auto split = data::split_documents(corpus, c.held_out_fraction, std::uint64_t(c.seed));
    olmax::check(!split.held_out.empty() && !split.train.empty(), "cannot split ", data_path.string(),
                 " into training and held-out text (", corpus.documents.size(), " documents, ", corpus.total_bytes(), " bytes)");
    const double baseline = unigram_baseline(split.train, split.held_out);
    std::size_t held_bytes = 0;
    for (const auto& d : split.held_out) held_bytes += d.size();
    std::cout << "corpus " << data_path.string() << ": " << corpus.files.size() << " files, " << corpus.documents.size() << " documents, "
              << corpus.total_bytes() << " bytes; held out "
              << (split.by_position ? std::string("the last ") : std::to_string(split.held_out.size()) + " documents (") << held_bytes
              << (split.by_position ? " bytes of the single document\n" : " bytes)\n");
    std::printf("unigram baseline on held-out bytes: %.4f nats/byte (%.3f bits/byte)\n", baseline, baseline / std::log(2.0));
    data::PackedLoader loader(split.train, {std::size_t(c.batch), std::size_t(c.sequence), std::uint64_t(c.seed), true, true});

    // ---- model, optimiser, resume ----------------------------------------------------------
    Model model(model_config);  // checked above
    optim::AdamW<Model::value_type> opt(model.parameters(), models::optimizer_config(c));
    std::size_t parameter_count = 0;
    for (const auto& p : opt.parameters()) parameter_count += p.tensor.size();
    std::cout << "model: " << c.depth << " x " << Model::recipe_type::description << ", "
              << c.features << " features, " << parameter_count << " parameters\n";

    io::CheckpointDirectory checkpoints(c.checkpoint_dir, std::size_t(c.keep_checkpoints));
    for (const auto& name : checkpoints.remove_stale_temporaries())
        std::cout << "removed " << name << " (left by a save that was interrupted)\n";
    std::vector<std::string> notices;
    const auto existing = checkpoints.list(&notices);
    for (const auto& notice : notices) std::cout << "checkpoint folder: " << notice << "\n";
    std::int64_t step = 0;
    if (c.resume && !existing.empty()) {
        std::vector<std::string> rejected;
        auto loaded = checkpoints.load_latest(existing, &rejected);
        if (loaded) {
            for (const auto& why : loaded->rejected) std::cout << "skipped damaged checkpoint " << why << "\n";
            const auto state = io::restore_checkpoint(loaded->archive, opt);
            loader.restore(data::DataPosition::from_text(state.data_position));
            step = state.step;
            std::cout << "resumed from " << loaded->path.string() << " at step " << step << "\n";
        } else {
            // Training afresh here would mix this run's checkpoints with the damaged ones.
            for (const auto& why : rejected) std::cerr << "rejected checkpoint " << why << "\n";
            throw olmax::value_error(olmax::detail::concat("none of the ", existing.size(), " checkpoints in ", c.checkpoint_dir,
                                                           " loads (reasons above); remove them or choose another --checkpoint_dir"));
        }
    }
    // A fresh run must not mix its checkpoints with an earlier run's (the newest step would win).
    olmax::check(step > 0 || existing.empty(), c.checkpoint_dir, " holds ", existing.size(),
                 " checkpoints of an earlier run; pass --resume=true to continue it or choose another --checkpoint_dir");
    if (c.dry_run) {
        std::cout << "dry run: flags, data, model" << (step > 0 ? " and checkpoint" : "") << " are fine; not training\n";
        return 0;
    }
    std::filesystem::create_directories(c.checkpoint_dir);
    const auto metrics_path = std::filesystem::path(c.checkpoint_dir) / "metrics.csv";
    io::MetricsLog metrics(metrics_path, step > 0);
    auto save = [&](std::int64_t at, const std::string& note) {
        return checkpoints.save(io::make_checkpoint(opt, io::TrainingState{at, config::to_text(c), loader.position().to_text(), note}), at);
    };

    // ---- training loop ----------------------------------------------------------------------
    const double tokens_per_step = double(c.batch * c.sequence * c.grad_accumulation);
    const std::size_t shards = models::shards_for(c);
    io::ProgressBar progress(std::cout, c.steps, io::stdout_is_terminal(), c.log_every, step);
    double tokens_this_run = 0, last_eval = std::nan("");
    std::filesystem::path last_checkpoint;
    while (step < c.steps) {
        double loss_sum = 0;
        for (std::int64_t micro = 0; micro < c.grad_accumulation; ++micro)
            loss_sum += model.accumulate_gradients(*loader.next(), shards, 1.0 / double(c.grad_accumulation));
        const double loss = loss_sum / double(c.grad_accumulation);
        try {
            olmax::check<optim::non_finite_gradient>(std::isfinite(loss), "the loss is ", loss, " at step ", step + 1);
            opt.step();
        } catch (const optim::non_finite_gradient& e) {
            progress.message(std::string("training diverged: ") + e.what());
            progress.message(last_checkpoint.empty() ? "no checkpoint was written in this run"
                                                     : "the last good checkpoint is " + last_checkpoint.string());
            return 3;
        }
        opt.zero_grad();
        ++step;
        tokens_this_run += tokens_per_step;
        const double tokens_total = double(step) * tokens_per_step;
        metrics.write(step, tokens_total, "train", loss);
        if (step % c.eval_every == 0 || step == c.steps) {
            last_eval = evaluate(model, split.held_out, c);
            metrics.write(step, tokens_total, "eval", last_eval);
            char line[160];
            std::snprintf(line, sizeof line, "step %lld: held-out loss %.4f nats/byte (%.3f bits/byte; unigram %.4f)",
                          static_cast<long long>(step), last_eval, last_eval / std::log(2.0), baseline);
            progress.message(line);
        }
        if (step % c.checkpoint_every == 0 || step == c.steps) last_checkpoint = save(step, "train loss " + std::to_string(loss));
        char extra[64];
        std::snprintf(extra, sizeof extra, "lr %.2e  eval %.3f", opt.next_lr(), last_eval);
        progress.update(step, loss, tokens_this_run, extra);
    }
    progress.finish();
    std::cout << "checkpoint: " << (last_checkpoint.empty() ? std::string("(none written in this run)") : last_checkpoint.string()) << "\n";

    // ---- loss curve -------------------------------------------------------------------------
    // The script sits in the source tree: found from this file's path (CMake compiles with absolute
    // paths), else from the executable's (<repo>/build/examples/train_lm), else from the working
    // directory (the repository root).
    auto script = std::filesystem::path(__FILE__).parent_path().parent_path() / "scripts" / "plot_loss.py";
    std::error_code no_exe;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", no_exe);
    for (const auto& candidate : {exe.parent_path().parent_path().parent_path() / "scripts" / "plot_loss.py",
                                  std::filesystem::path("scripts") / "plot_loss.py"})
        if (!std::filesystem::exists(script)) script = candidate;
    const auto png = std::filesystem::path(c.checkpoint_dir) / "loss.png";
    const std::string plot = "/usr/bin/python3 '" + script.string() + "' '" + metrics_path.string() + "' -o '" + png.string() +
                             "' --baseline " + std::to_string(baseline);
    if (c.plot) {
        if (std::filesystem::exists(script) && std::filesystem::exists("/usr/bin/python3") && std::system((plot + " > /dev/null").c_str()) == 0)
            std::cout << "loss curve: " << png.string() << "\n";
        else
            std::cout << "loss curve not drawn; run: " << plot << "\n";
    }

    // ---- samples ----------------------------------------------------------------------------
    olmax::Generator sampler(std::uint64_t(c.seed) + 1);
    const data::SamplingConfig sampling{c.temperature, std::size_t(c.top_k), c.top_p};
    for (int i = 0; i < 2 && c.sample_bytes > 0; ++i) {
        std::cout << "\n--- sample " << i + 1 << " (temperature " << c.temperature << ", top_p " << c.top_p << ") ---\n"
                  << c.prompt << model.sample(c.prompt, std::size_t(c.sample_bytes), std::size_t(c.sequence), sampling, sampler) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("train_lm", run, argc, argv); }
