// Trains a byte-level language model (olmax::models::ByteLM over the block recipe --block) on real
// text on the CPU, in one process or several (data parallel, --world_size / --rank / --rendezvous):
//     build/examples/train_lm                      # default corpus: Debian package `fortunes`
//     build/examples/train_lm --data=notes/ --steps=2000 --preset=small --block=mamba
//     bash tools/launch_local.sh 2 build/examples/train_lm   # 2 processes on this machine
//     build/examples/train_lm --help
// Shows a progress bar (plain log lines when stdout is not a terminal), evaluates on held-out
// documents, writes checkpoints (resumed automatically), metrics.csv and loss.png into
// --checkpoint_dir, and prints samples at the end. Exit status (olmax/config/program.hpp): 0 done,
// 1 bad input or another failure, 2 bad usage (flags, or ranks started with settings that
// disagree), 3 training diverged (NaN/Inf; the last good checkpoint is kept), 130 / 143 stopped by
// SIGINT / SIGTERM after finishing the current step and writing a checkpoint (all ranks together;
// a second SIGINT stops at once, without one).

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include <olmax/olmax.hpp>
#if defined(TRAIN_LM_WITH_ONEDNN)
#include <olmax/backend/onednn_gemm.hpp>
#endif
#include <olmax/distributed/agreement.hpp>
#include <olmax/distributed/overlapped_allreduce.hpp>
#include <olmax/distributed/stop.hpp>
#if defined(TRAIN_LM_WITH_GLOO)  // set by examples/CMakeLists.txt when CMake found Gloo
#include <olmax/distributed/gloo.hpp>
#endif
#if defined(TRAIN_LM_WITH_PJRT)  // set by examples/CMakeLists.txt when the PJRT runtime (olmax::pjrt) is there
#include <olmax/models/xla_trainer.hpp>
#endif

namespace {

namespace config = olmax::config;
namespace data = olmax::data;
namespace dist = olmax::distributed;
namespace io = olmax::io;
namespace models = olmax::models;
namespace optim = olmax::optim;

/// Held-out loss of the model: the first `eval_batches` batches of a fresh one-pass loader (the
/// same bytes every time), in nats per byte over real targets only. The ranks share the batches
/// (rank r takes batches r, r + N, ...) and add their sums.
template <class Model>
double evaluate(const Model& model, const data::Documents& held_out, const config::TrainConfig& c, dist::Communicator& comm) {
    data::PackedLoader loader(held_out, {std::size_t(c.batch), std::size_t(c.sequence), std::uint64_t(c.seed), false, false});
    std::array<double, 2> sums{0, 0};  // nll, count
    for (std::int64_t i = 0; i < c.eval_batches; ++i) {
        auto batch = loader.next();
        if (!batch) break;
        if (i % comm.world_size() != comm.rank()) continue;
        const auto [nll, n] = model.masked_nll(*batch);
        sums[0] += nll;
        sums[1] += n;
    }
    comm.allreduce(std::span<double>(sums));
    return sums[1] > 0 ? sums[0] / sums[1] : std::nan("");
}

/// The group of processes this run trains in: itself alone, or the ranks met at --rendezvous.
std::unique_ptr<dist::Communicator> connect(const config::TrainConfig& c) {
    const auto timeout = dist::Timeout(std::int64_t(c.collective_timeout_s * 1000));
    if (c.world_size == 1) return std::make_unique<dist::LocalCommunicator>(timeout);
#if defined(TRAIN_LM_WITH_GLOO)
    // OLMAX_HOSTNAME / OLMAX_INTERFACE (the address this rank listens on) from the environment.
    auto options = dist::parse_rendezvous(c.rendezvous, int(c.rank), int(c.world_size), dist::GlooOptions::from_environment());
    options.timeout = timeout;
    return std::make_unique<dist::GlooCommunicator>(options);
#else
    throw config::config_error("config: --world_size > 1 needs a train_lm built with Gloo (Debian: libgloo-dev; CMake did not find it)");
#endif
}

/// Rank 0 reads the checkpoint folder and hands the checkpoint it resumes from (if any) to the
/// other ranks, so only rank 0 needs the folder. A failure on rank 0 reaches the others as an
/// error instead of a timeout.
std::optional<olmax::io::Archive> share_checkpoint(dist::Communicator& comm, const std::function<std::optional<olmax::io::Archive>()>& load) {
    if (comm.world_size() == 1) return load();
    std::int64_t size = -1;
    std::optional<olmax::io::Archive> archive;
    std::string bytes;
    if (comm.rank() == 0) {
        try {
            archive = load();
            if (archive) bytes = archive->serialize();
            size = std::int64_t(bytes.size());
        } catch (...) {
            comm.broadcast(std::span<std::int64_t>(&size, 1));
            throw;
        }
    }
    comm.broadcast(std::span<std::int64_t>(&size, 1));
    olmax::check<dist::distributed_error>(size >= 0, "rank 0 could not prepare the checkpoint folder (its error is in its output)");
    if (size == 0) return std::nullopt;
    bytes.resize(std::size_t(size));
    comm.broadcast(std::span<char>(bytes.data(), bytes.size()));
    if (comm.rank() != 0) archive = olmax::io::Archive::deserialize(bytes, "rank 0's checkpoint");
    return archive;
}

/// Flags that may differ between the ranks: where each finds its files and peers, its own threads
/// and timeouts, and what only rank 0 does (checkpoints, logs, the plot, samples, the time budget's
/// verdict). Every other flag must agree (docs/DISTRIBUTED.md).
bool may_differ_between_ranks(std::string_view key) {
    static const std::unordered_set<std::string_view> keys{
        "data", "checkpoint_dir", "rendezvous", "rank", "collective_timeout_s", "xla_plugin",              // files and peers
        "threads", "data_parallel", "kept_layers",                                                       // this process's resources
        "checkpoint_every", "keep_checkpoints", "resume", "log_every", "plot", "time_budget_s",           // rank 0's
        "sample_bytes", "temperature", "top_k", "top_p", "prompt"};
    return keys.contains(key);
}

/// What the ranks must agree on before their first collective whose size depends on it: the
/// olmax version, every flag that must agree, each rank's share of the batch, the training bytes
/// (by content: --data may name another path on each machine), every parameter's name, element
/// type and shape, and the step of the checkpoint resumed from.
template <class Named>
dist::Fingerprint fingerprint_of(const config::TrainConfig& c, const data::Documents& train_documents, const std::vector<Named>& parameters,
                                 std::int64_t resumed_step) {
    dist::Fingerprint f;
    f.add("olmax version", olmax::version_string);
    std::istringstream lines(config::to_text(c));
    for (std::string line; std::getline(lines, line);) {
        const auto eq = line.find(" = ");
        if (eq == std::string::npos || may_differ_between_ranks(std::string_view(line).substr(0, eq))) continue;
        f.add("--" + line.substr(0, eq), line.substr(eq + 3));
    }
    f.add("rows per rank", c.batch / c.world_size);
    std::uint64_t hash = 14695981039346656037ull, bytes = 0;  // FNV-1a over the documents, each ended by a 0xff
    for (const auto& d : train_documents) {
        for (const std::uint8_t b : d) hash = (hash ^ b) * 1099511628211ull;
        hash = (hash ^ 0xffu) * 1099511628211ull;
        bytes += d.size();
    }
    char text[96];
    std::snprintf(text, sizeof text, "%zu documents, %" PRIu64 " bytes, FNV-1a %016" PRIx64, train_documents.size(), bytes, hash);
    f.add("training documents", text);
    f.add_parameters(parameters);
    f.add("resumed from step", resumed_step);
    return f;
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

/// The compiled whole step for --device=xla (null for --device=cpu): the model's step traced once,
/// compiled for the PJRT plugin --xla_plugin (or $OLMAX_PJRT_PLUGIN), its state on the device.
#if defined(TRAIN_LM_WITH_PJRT)
template <class Model>
using XlaTrainerOf = models::XlaTrainer<Model>;
#else
template <class Model>
struct XlaTrainerOf {  // a train_lm without the PJRT runtime refuses --device=xla before one is made
    struct StepResult {
        double loss = 0, grad_norm = 0;
    };
    StepResult step(const data::Batch&) { return {}; }
    void download() {}
};
#endif

/// --device=xla's settings, before any work: a train_lm with the PJRT runtime, a block with a
/// lowering rule, a plugin named.
template <class Model>
void check_xla_settings(const config::TrainConfig& c) {
    if (c.device != "xla") return;
    olmax::check<config::config_error>(c.kept_layers == 0, "config: --kept_layers is for --device=cpu (the XLA step is compiled as "
                                                           "a whole, its memory planned by XLA); leave it at 0 with --device=xla");
#if !defined(TRAIN_LM_WITH_PJRT)
    throw config::config_error("config: --device=xla needs a train_lm built with the PJRT runtime (CMake found no PJRT header: run "
                               "tools/setup_jax_venv.sh or set OLMAX_PJRT_INCLUDE_DIR, then rebuild)");
#else
    const char* env = std::getenv("OLMAX_PJRT_PLUGIN");
    const std::string plugin = !c.xla_plugin.empty() ? c.xla_plugin : env ? std::string(env) : std::string();
    olmax::check<config::config_error>(!plugin.empty(),
                                       "config: --device=xla needs a PJRT plugin: --xla_plugin=PATH or the environment variable OLMAX_PJRT_PLUGIN "
                                       "(this machine's CPU: the xla-cpu-pjrt wheel's xla_cpu_pjrt.so, which tools/setup_jax_venv.sh installs "
                                       "in .venv; docs/xla.md names the TPU and NVIDIA plugins)");
    olmax::check<config::config_error>(std::filesystem::exists(plugin), "config: --device=xla: the PJRT plugin ", plugin, " does not exist");
#endif
}

template <class Model>
std::unique_ptr<XlaTrainerOf<Model>> make_xla_trainer(const config::TrainConfig& c, Model& model, optim::AdamW<float>& opt, std::ostream& out) {
    if (c.device != "xla") return nullptr;
#if defined(TRAIN_LM_WITH_PJRT)
    {
        namespace pjrt = olmax::xla::pjrt;
        const auto& plugin = pjrt::plugin::load(c.xla_plugin);
        auto client = std::make_shared<pjrt::client>(plugin);
        const auto started = std::chrono::steady_clock::now();
        auto trainer = std::make_unique<XlaTrainerOf<Model>>(model, opt, client, std::size_t(c.batch), std::size_t(c.sequence), int(c.xla_devices));
        char line[200];
        std::snprintf(line, sizeof line, "device xla: %s, %zu device(s), step compiled in %.2f s (%zu bytes of StableHLO), data parallel over %lld\n",
                      plugin.path().c_str(), client->device_count(),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), trainer->module().text.size(),
                      static_cast<long long>(c.xla_devices));
        out << line;
        return trainer;
    }
#else
    (void)model, (void)opt, (void)out;
    check_xla_settings<Model>(c);  // refuses this case (run() calls it before any work)
    return nullptr;
#endif
}

template <class Recipe>
int train(const config::TrainConfig& c, dist::Communicator& comm);

int run(int argc, char** argv) {
    config::TrainConfig c;
    const auto cl = config::parse_train_command_line(c, argc, argv);
    if (cl.help) {
        std::cout << "usage: train_lm [--config=FILE] [--key=value ...]\n\n" << config::help_text<config::TrainConfig>()
                  << "\nexit status: 0 done, 1 failure, 2 usage error (or ranks that disagree), 3 training diverged, 130 / 143 stopped by "
                     "SIGINT / SIGTERM (after the current step and a checkpoint)\n";
        return 0;
    }
    // From here on, SIGINT and SIGTERM end the run at the next step boundary, with a checkpoint.
    olmax::stop_on_signals stop("train_lm", "finishing the current step, then writing a checkpoint");
    olmax::check<config::config_error>(cl.positional.empty(), "unexpected argument '", cl.positional.empty() ? "" : cl.positional[0],
                                       "' (flags are --key=value)");
    c.validate();
    return models::with_recipe(c.block, [&]<class Recipe>() {
        models::ByteLM<Recipe>::check_trainable(models::ByteLMConfig::from(c), std::size_t(c.batch), std::size_t(c.sequence));  // before any work
        check_xla_settings<models::ByteLM<Recipe>>(c);
        const auto comm = connect(c);
        return train<Recipe>(c, *comm);
    });
}

template <class Recipe>
int train(const config::TrainConfig& c, dist::Communicator& comm) {
    using Model = models::ByteLM<Recipe>;  // fp32
    const bool lead = comm.rank() == 0;    // rank 0 prints, evaluates' sums, writes checkpoints and metrics
    std::ostream null_out(nullptr);        // the other ranks' progress goes nowhere (errors still reach stderr)
    std::ostream& out = lead ? std::cout : null_out;
    const auto model_config = models::ByteLMConfig::from(c);
#if defined(_OPENMP)
    if (c.threads > 0) omp_set_num_threads(int(c.threads));
#endif
    out << "# resolved config\n" << config::to_text(c) << std::flush;
    if (comm.world_size() > 1)
        std::cout << "rank " << comm.rank() << " of " << comm.world_size() << " (" << comm.backend_name() << "): rows "
                  << c.batch * comm.rank() / comm.world_size() << ".." << c.batch * (comm.rank() + 1) / comm.world_size() - 1
                  << " of each batch\n" << std::flush;

    // ---- data -------------------------------------------------------------------------------
    const std::filesystem::path data_path = c.data.empty() ? data::default_corpus_path() : std::filesystem::path(c.data);
    const auto corpus = data::read_corpus(data_path);
    for (const auto& line : corpus.report()) out << "data: " << line << "\n";
    auto split = data::split_documents(corpus, c.held_out_fraction, std::uint64_t(c.seed));
    olmax::check(!split.held_out.empty() && !split.train.empty(), "cannot split ", data_path.string(),
                 " into training and held-out text (", corpus.documents.size(), " documents, ", corpus.total_bytes(), " bytes)");
    const double baseline = unigram_baseline(split.train, split.held_out);
    std::size_t held_bytes = 0;
    for (const auto& d : split.held_out) held_bytes += d.size();
    out << "corpus " << data_path.string() << ": " << corpus.files.size() << " files, " << corpus.documents.size() << " documents, "
              << corpus.total_bytes() << " bytes; held out "
              << (split.by_position ? std::string("the last ") : std::to_string(split.held_out.size()) + " documents (") << held_bytes
              << (split.by_position ? " bytes of the single document\n" : " bytes)\n");
    {
        char line[128];
        std::snprintf(line, sizeof line, "unigram baseline on held-out bytes: %.4f nats/byte (%.3f bits/byte)\n", baseline,
                      baseline / std::log(2.0));
        out << line;
    }
    data::PackedLoader loader(split.train, {std::size_t(c.batch), std::size_t(c.sequence), std::uint64_t(c.seed), true, true});

    // ---- model, optimiser, resume ----------------------------------------------------------
    Model model(model_config);  // checked above
    model.stack.keep_activations(std::size_t(c.kept_layers));
    optim::AdamW<typename Model::value_type> opt(model.parameters(), models::optimizer_config(c));
    const auto tensors = dist::tensors_of(opt.parameters());
    std::size_t parameter_count = 0;
    for (const auto& t : tensors) parameter_count += t.size();
    out << "model: " << c.depth << " x " << Recipe::description << ", " << c.features << " features, " << parameter_count
        << " parameters\n";

    io::CheckpointDirectory checkpoints(c.checkpoint_dir, std::size_t(c.keep_checkpoints));
    std::int64_t step = 0;
    const auto resumed = share_checkpoint(comm, [&]() -> std::optional<io::Archive> {
        for (const auto& name : checkpoints.remove_stale_temporaries())
            out << "removed " << name << " (left by a save that was interrupted)\n";
        std::vector<std::string> notices;
        const auto existing = checkpoints.list(&notices);
        for (const auto& notice : notices) out << "checkpoint folder: " << notice << "\n";
        // A fresh run must not mix its checkpoints with an earlier run's (the newest step would win).
        olmax::check(c.resume || existing.empty(), c.checkpoint_dir, " holds ", existing.size(),
                     " checkpoints of an earlier run; pass --resume=true to continue it or choose another --checkpoint_dir");
        if (existing.empty()) return std::nullopt;
        std::vector<std::string> rejected;
        auto loaded = checkpoints.load_latest(existing, &rejected);
        if (!loaded)
            for (const auto& why : rejected) std::cerr << "rejected checkpoint " << why << "\n";
        // Training afresh here would mix this run's checkpoints with the damaged ones.
        olmax::check<olmax::value_error>(loaded.has_value(), "none of the ", existing.size(), " checkpoints in ", c.checkpoint_dir,
                                         " loads (reasons above); remove them or choose another --checkpoint_dir");
        for (const auto& why : loaded->rejected) out << "skipped damaged checkpoint " << why << "\n";
        out << "resumed from " << loaded->path.string() << " at step " << loaded->archive.integer("train/step") << "\n";
        return std::move(loaded->archive);
    });
    // Before the first collective whose size depends on the model or the flags (broadcast_parameters):
    // ranks started differently stop here, all with the same line, instead of crashing in Gloo.
    try {
        dist::check_agreement(comm, fingerprint_of(c, split.train, opt.parameters(), resumed ? resumed->integer("train/step") : 0));
    } catch (const dist::disagreement_error& e) {
        std::cerr << "train_lm: " << e.what() << std::endl;
        return config::exit_usage;
    }
    if (resumed) {
        config::TrainConfig saved;
        config::load_text(saved, resumed->text("train/config"), "the checkpoint's config");
        olmax::check<config::config_error>(saved.block == c.block, "the checkpoint in ", c.checkpoint_dir, " was trained with --block=",
                                           saved.block, ", not --block=", c.block, "; choose another --checkpoint_dir");
        const auto state = io::restore_checkpoint(*resumed, opt);
        loader.restore(data::DataPosition::from_text(state.data_position));
        step = state.step;
        if (saved.world_size != c.world_size)
            out << "note: the checkpoint was written by " << saved.world_size << " process(es), this run has " << c.world_size
                << ": the global batch and the data order are unchanged, only the rounding of the gradient sums differs\n";
    }
    dist::broadcast_parameters(comm, tensors);  // every rank starts from rank 0's values
    const auto xla = make_xla_trainer(c, model, opt, out);  // after the resume: it uploads the host state
    if (c.dry_run) {
        out << "dry run: flags, data, model" << (step > 0 ? " and checkpoint" : "") << " are fine; not training\n";
        return 0;
    }
    std::optional<io::MetricsLog> metrics;
    const auto metrics_path = std::filesystem::path(c.checkpoint_dir) / "metrics.csv";
    if (lead) {
        std::filesystem::create_directories(c.checkpoint_dir);
        metrics.emplace(metrics_path, step > 0);
    }
    auto save = [&](std::int64_t at, const std::string& note) {
        if (xla) xla->download();
        return checkpoints.save(io::make_checkpoint(opt, io::TrainingState{at, config::to_text(c), loader.position().to_text(), note}), at);
    };

    // The precision policy covers training, evaluation and sampling (not the initialisation above).
    std::optional<olmax::backend::bf16_matmul_scope> bf16;
    if (c.precision == "bf16") {
#if defined(TRAIN_LM_WITH_ONEDNN)
        bf16.emplace(olmax::backend::onednn::gemm_bf16, olmax::backend::onednn::gemm_batched_bf16);  // the CPU's bf16 units where it has them
        if (lead) out << "precision bf16: GEMMs on " << olmax::backend::onednn::bf16_gemm_description() << "\n";
#else
        bf16.emplace();  // the portable product (fp32 compute; it says so once)
#endif
    }

    // ---- training loop ----------------------------------------------------------------------
    // Every rank draws the same global batch and differentiates its own rows (equal shares, so the
    // mean of the ranks' mean gradients is the batch's); the ranks then average their gradients.
    const double tokens_per_step = double(c.batch * c.sequence * c.grad_accumulation);
    const std::size_t shards = models::shards_for(c);
    const std::size_t rows = std::size_t(c.batch), ranks = std::size_t(comm.world_size()), rank = std::size_t(comm.rank());
    auto own_rows = [&](const data::Batch& batch) {
        return ranks == 1 ? batch : data::batch_rows(batch, rows * rank / ranks, rows * (rank + 1) / ranks);
    };
    // --overlap_allreduce: the last backward of each step hands finished gradient buckets to a
    // reducer thread that exchanges them while backward goes on (the same result, bit for bit).
    const dist::BucketOptions buckets{std::max<std::size_t>(1, std::size_t(c.bucket_mb * double(1 << 20))), {}};
    std::optional<dist::OverlappedAllreduce<typename Model::value_type>> reducer;
    if (c.overlap_allreduce && comm.world_size() > 1 && !xla) reducer.emplace(comm, tensors, dist::Reduction::mean, dist::OverlapOptions{buckets});
    io::ProgressBar progress(out, c.steps, lead && io::stdout_is_terminal(), c.log_every, step);
    double tokens_this_run = 0, last_eval = std::nan("");
    std::filesystem::path last_checkpoint;
    // Training time counts the steps only (data, forward, backward, gradient exchange, optimiser),
    // not evaluations, checkpoints or printing: the time budget and the final summary use it.
    using clock = std::chrono::steady_clock;
    auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
    double train_seconds = 0, exchange_seconds = 0;
    bool out_of_time = false;
    dist::StopDecision stopping;  // a signal asked some rank to stop: all stop after the same step
    while (step < c.steps && !out_of_time && !stopping.stop) {
        const auto step_started = clock::now();
        double loss = 0;
        try {
            if (xla) {
                // One execute: forward, gradients and the update on the device (the host model is
                // brought up to date before evaluations and checkpoints).
                const auto result = xla->step(*loader.next());
                loss = result.loss;
                out_of_time = c.time_budget_s > 0 && train_seconds + seconds_since(step_started) >= c.time_budget_s;
                stopping = dist::decide_stop(dist::stop_vote());  // one process (validate() refuses xla with world_size > 1)
                olmax::check<optim::non_finite_gradient>(std::isfinite(loss) && std::isfinite(result.grad_norm), "the loss is ", loss,
                                                         " and the gradient norm ", result.grad_norm, " at step ", step + 1,
                                                         " (on the device: its state is not kept)");
            } else {
                double loss_sum = 0, exchanged = 0;
                for (std::int64_t micro = 0; micro < c.grad_accumulation; ++micro) {
                    const data::Batch batch = own_rows(*loader.next());
                    auto backward = [&] { return model.accumulate_gradients(batch, shards, 1.0 / double(c.grad_accumulation)); };
                    if (c.update_in_backward && micro + 1 == c.grad_accumulation) {
                        // The update happens here (one process); with clipping backward runs twice on this batch.
                        double last = 0;
                        opt.step_during_backward([&] { last = backward(); });
                        loss_sum += last;
                    } else if (!reducer || micro + 1 < c.grad_accumulation) {
                        loss_sum += backward();
                    } else {
                        loss_sum += reducer->overlap(backward);  // gradients are final in the last micro-batch only
                        exchanged = reducer->finish_seconds();    // what backward did not hide
                    }
                }
                const auto exchange_started = clock::now();
                if (!reducer) dist::allreduce_gradients(comm, tensors, dist::Reduction::mean, buckets);
                // The batch's loss (mean over ranks), rank 0's verdict on the time budget and every
                // rank's stop vote (a signal received), in one exchange.
                const double elapsed = train_seconds + seconds_since(step_started);
                const auto vote = dist::stop_vote();
                std::array<double, 2 + dist::stop_vote_size> shared{loss_sum / double(c.grad_accumulation),
                                                                    lead && c.time_budget_s > 0 && elapsed >= c.time_budget_s ? 1.0 : 0.0};
                std::copy(vote.begin(), vote.end(), shared.begin() + 2);
                comm.allreduce(std::span<double>(shared));
                exchange_seconds += exchanged + seconds_since(exchange_started);
                loss = shared[0] / double(ranks);
                out_of_time = shared[1] > 0;
                stopping = dist::decide_stop(std::span<const double>(shared).subspan(2));
                olmax::check<optim::non_finite_gradient>(std::isfinite(loss), "the loss is ", loss, " at step ", step + 1);
                if (!c.update_in_backward) opt.step();
            }
        } catch (const optim::non_finite_gradient& e) {
            progress.message(std::string("training diverged: ") + e.what());
            progress.message(last_checkpoint.empty() ? "no checkpoint was written in this run"
                                                     : "the last good checkpoint is " + last_checkpoint.string());
            return 3;
        }
        opt.zero_grad();
        train_seconds += seconds_since(step_started);
        ++step;
        tokens_this_run += tokens_per_step;
        const double tokens_total = double(step) * tokens_per_step;
        if (metrics) metrics->write(step, tokens_total, "train", loss);
        const bool last = step == c.steps || out_of_time || stopping.stop;
        // A stop skips the final evaluation: a scheduler's grace period is short, the checkpoint matters.
        if (step % c.eval_every == 0 || (last && !stopping.stop)) {
            if (xla) xla->download();
            last_eval = evaluate(model, split.held_out, c, comm);
            if (metrics) metrics->write(step, tokens_total, "eval", last_eval);
            char line[160];
            std::snprintf(line, sizeof line, "step %lld: held-out loss %.4f nats/byte (%.3f bits/byte; unigram %.4f)",
                          static_cast<long long>(step), last_eval, last_eval / std::log(2.0), baseline);
            progress.message(line);
        }
        if (lead && (step % c.checkpoint_every == 0 || last)) last_checkpoint = save(step, "train loss " + std::to_string(loss));
        char extra[64];
        std::snprintf(extra, sizeof extra, "lr %.2e  eval %.3f", opt.config().schedule(step + 1), last_eval);
        progress.update(step, loss, tokens_this_run, extra);
    }
    progress.finish();
    {
        char line[240];
        if (out_of_time) {
            std::snprintf(line, sizeof line, "time budget of %.0f s reached after step %lld\n", c.time_budget_s, static_cast<long long>(step));
            out << line;
        }
        // Rank 0's figures; the exchange share is what training across processes costs per step.
        std::snprintf(line, sizeof line,
                      "trained %.0f tokens in %.2f s without evaluations (%.0f tokens/s, %.3f ms/step); gradient exchange %.2f s (%.1f%%) "
                      "across %d process(es)\n",
                      tokens_this_run, train_seconds, train_seconds > 0 ? tokens_this_run / train_seconds : 0.0,
                      tokens_this_run > 0 ? 1e3 * train_seconds * tokens_per_step / tokens_this_run : 0.0, exchange_seconds,
                      train_seconds > 0 ? 100 * exchange_seconds / train_seconds : 0.0, comm.world_size());
        out << line;
        if (reducer) {
            std::snprintf(line, sizeof line,
                          "overlapped exchange: %zu bucket(s) per step (at most %.3g MiB, split where gradients became final apart), "
                          "%zu sent before backward ended in the last step\n",
                          reducer->buckets().size(), c.bucket_mb, reducer->reduced_during_backward());
            out << line;
        }
    }
    if (stopping.stop) {
        // Every rank reports; rank 0 wrote the checkpoint. No loss curve, no samples: stop soon.
        const std::string by = olmax::signal_name(stopping.signal);
        if (lead)
            std::cout << "stopped by " << by << " after step " << step << "; checkpoint: " << last_checkpoint.string()
                      << " (the same command resumes from it)" << std::endl;
        else
            std::cout << "rank " << comm.rank() << ": stopped by " << by << " after step " << step
                      << " together with the other ranks (rank 0 wrote the checkpoint)" << std::endl;
        return stopping.exit_status();
    }
    if (!lead) return 0;  // the rest (loss curve, samples) is rank 0's
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
