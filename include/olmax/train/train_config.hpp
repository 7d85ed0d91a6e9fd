#pragma once
// The main job's config (examples/train_lm, examples/generate): the sections the modules own,
// composed, plus the program's own keys (preset, logging, threads, sampling). Printed at start and
// stored in every checkpoint (`config::to_text`); a checkpoint's text loads back by key, so the
// checkpoints of earlier versions (one TrainConfig in olmax::config) still resume.
//
//   section                    keys                                                 owner
//   train::DataConfig          data, held_out_fraction, seed, batch, sequence       train/text_data.hpp
//   models::ByteLMSettings     block, features, depth, kept_layers                  models/byte_lm.hpp
//   train::LoopConfig          steps, eval_*, checkpoint_*, resume, time_budget_s   train/trainer.hpp
//   train::OptimizerConfig     lr, warmup, ..., max_grad_norm                       train/optimizer.hpp
//   train::HostStepOptions     grad_accumulation, update_in_backward, ...           train/host_step.hpp
//   train::ProcessConfig       world_size, rank, rendezvous, collective_timeout_s   train/processes.hpp
//   train::DeviceConfig        device, xla_plugin, xla_devices, precision           train/device.hpp

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"
#include "olmax/models/byte_lm.hpp"
#include "olmax/train/device.hpp"
#include "olmax/train/host_step.hpp"
#include "olmax/train/optimizer.hpp"
#include "olmax/train/processes.hpp"
#include "olmax/train/text_data.hpp"
#include "olmax/train/trainer.hpp"

namespace olmax::train {

struct TrainConfig : DataConfig, models::ByteLMSettings, LoopConfig, OptimizerConfig, HostStepOptions, ProcessConfig, DeviceConfig {
    std::string preset = "tiny";  // sizes of the model and the batch; explicit flags override (with_preset)
    std::int64_t log_every = 50;
    std::int64_t threads = 2;
    bool dry_run = false;
    bool plot = true;
    // sampling at the end (and examples/generate)
    std::int64_t sample_bytes = 200;
    double temperature = 0.8;
    std::int64_t top_k = 0;
    double top_p = 0.95;
    std::string prompt = "The ";
    std::string decode = "stepwise";

    /// Keys of earlier versions, read as their new names: a checkpoint keeps its run's config text.
    /// xla_replicas (replicated data parallelism over the plugin's devices) became xla_devices (the
    /// same batch split, by XLA's SPMD partitioner).
    static const std::vector<std::pair<std::string_view, std::string_view>>& renamed_keys() {
        static const std::vector<std::pair<std::string_view, std::string_view>> renamed{{"xla_replicas", "xla_devices"}};
        return renamed;
    }

    static const std::vector<config::Field<TrainConfig>>& fields() {
        using C = TrainConfig;
        using config::Field;
        using config::section_fields;
        // Upper bounds are far beyond what fits in memory or time; the model's own check
        // (models::ByteLM::check_trainable) refuses sizes this machine cannot hold.
        constexpr double steps_max = 1e12, size_max = 1 << 20;
        static const std::vector<Field<C>> f = config::concat_fields(
            section_fields<C, DataConfig>(),
            std::vector<Field<C>>{Field<C>{"preset", &C::preset,
                                           "model and batch sizes: tiny (64 x 2, batch 8 x 64), small (128 x 4, batch 16 x 128), base (256 x 8, "
                                           "batch 16 x 256); speedrun: the 5-minute CPU speedrun's recipe (tiny sizes, block hybrid, rows of "
                                           "128, cosine decay from lr 0.008 over a 300 s budget; docs/QUALITY.md); flags given explicitly win",
                                           {"tiny", "small", "base", "speedrun"}}},
            section_fields<C, models::ByteLMSettings>(), section_fields<C, LoopConfig>(), section_fields<C, OptimizerConfig>(),
            section_fields<C, HostStepOptions>(),
            std::vector<Field<C>>{
                Field<C>{"log_every", &C::log_every, "steps between log lines when stdout is not a terminal"}.in(1, steps_max),
                Field<C>{"threads", &C::threads, "OpenMP threads (0: all cores); results are deterministic for a given count"}.in(0, 1024),
                Field<C>{"dry_run", &C::dry_run, "check the flags, read the data, build the model and load the checkpoint, then stop"},
                Field<C>{"plot", &C::plot, "draw loss.png at the end (python3 with matplotlib)"},
            },
            section_fields<C, ProcessConfig>(), section_fields<C, DeviceConfig>(),
            std::vector<Field<C>>{
                Field<C>{"sample_bytes", &C::sample_bytes, "bytes to generate after training"}.in(0, size_max),
                Field<C>{"temperature", &C::temperature, "sampling temperature (0: greedy)"}.in(0, 100),
                Field<C>{"top_k", &C::top_k, "sample among the k most likely bytes (0: all)"}.in(0, 256),
                Field<C>{"top_p", &C::top_p, "nucleus sampling mass"}.greater_than(0).at_most(1),
                Field<C>{"prompt", &C::prompt, "text the samples start from"},
                Field<C>{"decode", &C::decode,
                         "how samples run the model: stepwise (each byte once through the layers, every block carrying its state: "
                         "recurrent states, convolution tails, attention's keys and values; the context is the last sequence/2 to "
                         "sequence bytes; conv_mixer and moe run the window instead) or window (the last sequence bytes again "
                         "for every byte)",
                         {"stepwise", "window"}},
            });
        return f;
    }

    /// Every key in its declared range and path kind (see fields()), each section's own checks,
    /// and the checks that span sections; errors name the keys.
    void validate() const {
        config::validate_fields(*this);
        OptimizerConfig::validate();
        DeviceConfig::validate();
        if (device == "xla") {
            check<config::config_error>(grad_accumulation == 1 && world_size == 1,
                                        "config: --device=xla runs one whole step per batch in one process; it needs "
                                        "grad_accumulation=1 and world_size=1 (got ", grad_accumulation, " and ", world_size, ")");
            check<config::config_error>(batch % xla_devices == 0, "config: key 'batch' (", batch, ") must be a multiple of 'xla_devices' (",
                                        xla_devices, ")");
            check<config::config_error>(adam_moments != "bf16", "config: --adam_moments=bf16 is for --device=cpu (its stochastic "
                                                                 "rounding has no XLA lowering yet); use fp32 or fp64 with --device=xla");
        }
        check<config::config_error>(!update_in_backward || (world_size == 1 && device == "cpu"),
                                    "config: --update_in_backward needs one process (world_size=1: gradients are exchanged before any "
                                    "update) and device=cpu (got world_size=", world_size, ", device=", device, ")");
        check<config::config_error>(!update_in_backward || max_grad_norm == 0 || grad_accumulation == 1,
                                    "config: --update_in_backward with global-norm clipping (max_grad_norm=", max_grad_norm,
                                    ") runs backward twice, the first run only measuring the norm, so the gradients of earlier "
                                    "micro-batches cannot be kept: set grad_accumulation=1 (got ", grad_accumulation, ") or max_grad_norm=0");
        check<config::config_error>(rank < world_size, "config: key 'rank' (", rank, ") must be below 'world_size' (", world_size, ")");
        check<config::config_error>(batch % world_size == 0, "config: key 'batch' (", batch, ") must be a multiple of 'world_size' (",
                                    world_size, "): every process takes an equal share of each batch's rows");
        ProcessConfig::validate();
    }

    /// A preset's keys over the defaults: the sizes (features, depth, batch, sequence), and for
    /// speedrun also the block, the schedule and the time budget. A program applies it first and
    /// the explicit flags after it.
    static TrainConfig with_preset(const std::string& name) {
        TrainConfig c;
        c.preset = name;
        if (name == "tiny") return c;
        if (name == "small") {
            c.features = 128, c.depth = 4, c.batch = 16, c.sequence = 128;
            return c;
        }
        if (name == "base") {
            c.features = 256, c.depth = 8, c.batch = 16, c.sequence = 256;
            return c;
        }
        if (name == "speedrun") {  // the recipe of docs/QUALITY.md's speedrun tables, measured on 2 threads
            c.block = "hybrid", c.sequence = 128, c.lr_schedule = "cosine", c.lr = 0.008, c.time_budget_s = 300;
            c.steps = 1'000'000'000'000;  // the budget ends the run (and the cosine schedule), not a step count
            return c;
        }
        throw config::config_error(olmax::detail::concat("config: key 'preset' must be tiny, small, base or speedrun, got '", name, "'"));
    }
};

/// config::parse_command_line for a TrainConfig with presets: the flags (and --config file) are
/// read once to find the preset, then applied again over that preset's sizes, so explicit keys win.
inline config::CommandLine parse_train_command_line(TrainConfig& c, int argc, const char* const* argv) {
    TrainConfig scratch = c;
    const config::CommandLine first = config::parse_command_line(scratch, argc, argv);
    if (first.help) return first;
    c = TrainConfig::with_preset(scratch.preset);
    return config::parse_command_line(c, argc, argv);
}

/// The config's --decode, how ByteLM::sample runs the model.
inline models::Decoding decoding(const TrainConfig& c) { return c.decode == "window" ? models::Decoding::window : models::Decoding::stepwise; }

/// The Trainer's settings for the main job: its loop keys, batch, precision and threads, the config
/// text stored and compared, the keys that may differ between ranks, and the resume's checks that a
/// checkpoint was trained with the same --block (and a note when by another --world_size).
inline TrainerOptions trainer_options(const TrainConfig& c) {
    TrainerOptions o;
    static_cast<LoopConfig&>(o) = c;
    o.batch = std::size_t(c.batch), o.sequence = std::size_t(c.sequence), o.seed = std::uint64_t(c.seed);
    o.precision = c.precision, o.threads = c.threads;
    o.config_text = config::to_text(c);
    o.rank_local_keys = {
        "data", "checkpoint_dir", "rendezvous", "rank", "collective_timeout_s", "xla_plugin",     // files and peers
        "threads", "data_parallel", "kept_layers",                                              // this process's resources
        "checkpoint_every", "keep_checkpoints", "resume", "log_every", "plot", "time_budget_s",  // rank 0's
        "sample_bytes", "temperature", "top_k", "top_p", "prompt", "decode"};                   // (docs/DISTRIBUTED.md)
    o.check_resumed_config = [block = c.block, world_size = c.world_size, dir = c.checkpoint_dir](std::string_view text) {
        TrainConfig saved;
        config::load_text(saved, text, "the checkpoint's config");
        check<config::config_error>(saved.block == block, "the checkpoint in ", dir, " was trained with --block=", saved.block,
                                    ", not --block=", block, "; choose another --checkpoint_dir");
        if (saved.world_size == world_size) return std::string();
        return olmax::detail::concat("note: the checkpoint was written by ", saved.world_size, " process(es), this run has ", world_size,
                                     ": the global batch and the data order are unchanged, only the rounding of the gradient sums differs");
    };
    return o;
}

}  // namespace olmax::train
