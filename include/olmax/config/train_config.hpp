#pragma once
// The training run's settings (examples/train_lm), with defaults sized for a few minutes on 2 CPU
// cores. Printed at start and stored in every checkpoint (`to_text`). Plain values only: config sits
// beside optim and does not include it, so turning these keys into an optim::AdamWConfig is the
// job of models::optimizer_config (olmax/models/training.hpp).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/core/error.hpp"

namespace olmax::config {

struct TrainConfig {
    // data
    std::string data;  // file or folder; empty = the default corpus (Debian package fortunes)
    double held_out_fraction = 0.05;
    std::int64_t seed = 0;
    std::int64_t batch = 8;
    std::int64_t sequence = 64;
    // model
    std::string preset = "tiny";  // sizes below; explicit flags override (TrainConfig::with_preset)
    std::string block = "conv_mixer";
    std::int64_t features = 64;
    std::int64_t depth = 2;
    // optimisation
    std::int64_t steps = 10000;
    std::int64_t grad_accumulation = 1;
    double lr = 3e-3;
    std::int64_t warmup = 50;
    double lr_decay = 1e-4;
    std::int64_t decay_start = -1;
    double min_lr = 0.0;
    double beta1 = 0.9;
    double beta2 = 0.99;
    double eps = 1e-8;
    double weight_decay = 0.01;
    std::string decay_policy = "matrices";
    double agc_clip = 0.0;
    double max_grad_norm = 1.0;
    bool update_in_backward = false;
    // evaluation, checkpoints, logging
    std::int64_t eval_every = 250;
    std::int64_t eval_batches = 16;
    std::int64_t checkpoint_every = 500;
    std::string checkpoint_dir = "runs/train_lm";
    std::int64_t keep_checkpoints = 3;
    bool resume = true;
    std::int64_t log_every = 50;
    std::int64_t threads = 2;
    bool data_parallel = true;
    bool dry_run = false;
    bool plot = true;
    double time_budget_s = 0;  // 0: off
    // data parallelism across processes (olmax::distributed)
    std::int64_t world_size = 1;
    std::int64_t rank = 0;
    std::string rendezvous;  // file:DIR or tcp:HOST:PORT
    double collective_timeout_s = 120;
    // Exchange gradient buckets during backward (distributed::OverlappedAllreduce): the same result;
    // measured faster for the tiny preset on 2 processes here, a wash for small (docs/DISTRIBUTED.md).
    bool overlap_allreduce = true;
    double bucket_mb = 25;  // MiB of gradients per collective (PyTorch DDP's default)
    // where the steps run (the whole-step XLA path: docs/xla.md)
    std::string device = "cpu";
    std::string xla_plugin;  // empty: $OLMAX_PJRT_PLUGIN
    std::int64_t xla_devices = 1;
    std::string precision = "fp32";  // fp32 | bf16 (olmax::backend::bf16_matmul_scope)
    std::int64_t kept_layers = 0;      // recompute as a budget (nn::Stack::keep_activations)
    // sampling at the end
    std::int64_t sample_bytes = 200;
    double temperature = 0.8;
    std::int64_t top_k = 0;
    double top_p = 0.95;
    std::string prompt = "The ";

    /// Keys of earlier versions, read as their new names: a checkpoint keeps its run's config text.
    /// xla_replicas (replicated data parallelism over the plugin's devices) became xla_devices (the
    /// same batch split, by XLA's SPMD partitioner).
    static const std::vector<std::pair<std::string_view, std::string_view>>& renamed_keys() {
        static const std::vector<std::pair<std::string_view, std::string_view>> renamed{{"xla_replicas", "xla_devices"}};
        return renamed;
    }

    static const std::vector<Field<TrainConfig>>& fields() {
        using C = TrainConfig;
        // Upper bounds are far beyond what fits in memory or time; the model's own check
        // (models::ByteLM::check_trainable) refuses sizes this machine cannot hold.
        constexpr double steps_max = 1e12, size_max = 1 << 20;
        static const std::vector<Field<C>> f{
            Field<C>{"data", &C::data, "text file or folder to train on (empty: the Debian `fortunes` corpus)"}.names(PathKind::input),
            Field<C>{"held_out_fraction", &C::held_out_fraction, "fraction of documents (of bytes, for one document) held out for evaluation"}
                .greater_than(0).at_most(0.5),
            Field<C>{"seed", &C::seed, "seed for initialisation, data order and sampling"}.at_least(0),
            Field<C>{"batch", &C::batch, "rows per step (each row is a packed stream of documents)"}.in(1, 1 << 16),
            Field<C>{"sequence", &C::sequence, "bytes per row per step (a multiple of 16 for the conv_mixer and moe blocks)"}.in(16, size_max),
            Field<C>{"preset", &C::preset, "model and batch sizes: tiny (64 x 2, batch 8 x 64), small (128 x 4, batch 16 x 128), "
                                           "base (256 x 8, batch 16 x 256); flags given explicitly win", {"tiny", "small", "base"}},
            Field<C>{"block", &C::block, "block type of the model (olmax::models recipes)", {"conv_mixer", "qrnn", "mamba", "moe"}},
            Field<C>{"features", &C::features, "model width"}.in(1, 1 << 16),
            Field<C>{"depth", &C::depth, "number of blocks"}.in(1, 1 << 12),
            Field<C>{"steps", &C::steps, "optimiser steps"}.in(1, steps_max),
            Field<C>{"grad_accumulation", &C::grad_accumulation, "micro-batches summed per optimiser step"}.in(1, 1 << 16),
            Field<C>{"lr", &C::lr, "peak learning rate"}.greater_than(0).at_most(10),
            Field<C>{"warmup", &C::warmup, "linear warmup steps"}.in(0, steps_max),
            Field<C>{"lr_decay", &C::lr_decay, "exponential decay rate per step after decay_start"}.at_least(0).less_than(1),
            Field<C>{"decay_start", &C::decay_start, "first decayed step (-1: end of warmup)"}.in(-1, steps_max),
            Field<C>{"min_lr", &C::min_lr, "floor of the decayed learning rate"}.in(0, 10),
            Field<C>{"beta1", &C::beta1, "Adam first-moment decay"}.at_least(0).less_than(1),
            Field<C>{"beta2", &C::beta2, "Adam second-moment decay"}.at_least(0).less_than(1),
            Field<C>{"eps", &C::eps, "Adam epsilon"}.greater_than(0).at_most(1),
            Field<C>{"weight_decay", &C::weight_decay, "decoupled weight decay"}.in(0, 10),
            Field<C>{"decay_policy", &C::decay_policy, "which parameter roles are decayed", {"matrices", "embeddings_only", "all", "none"}},
            Field<C>{"agc_clip", &C::agc_clip, "unit-wise adaptive gradient clipping ratio (0: off)"}.in(0, 1e6),
            Field<C>{"max_grad_norm", &C::max_grad_norm, "global gradient-norm clip (0: off)"}.in(0, 1e12),
            Field<C>{"update_in_backward", &C::update_in_backward,
                     "apply AdamW to each parameter (each layer's slice of the stacked ones) as soon as backward has finished its "
                     "gradient, and drop it: the gradients of the whole model never exist at once (the same numbers as the separate "
                     "step; with max_grad_norm > 0 backward runs twice, the first run measuring the norm, and needs grad_accumulation=1; "
                     "one process and the CPU path)"},
            Field<C>{"eval_every", &C::eval_every, "steps between held-out evaluations"}.in(1, steps_max),
            Field<C>{"eval_batches", &C::eval_batches, "held-out batches per evaluation"}.in(1, size_max),
            Field<C>{"checkpoint_every", &C::checkpoint_every, "steps between checkpoints"}.in(1, steps_max),
            Field<C>{"checkpoint_dir", &C::checkpoint_dir, "folder for checkpoints, metrics.csv and loss.png"}.names(PathKind::output_folder),
            Field<C>{"keep_checkpoints", &C::keep_checkpoints, "checkpoints kept in checkpoint_dir"}.in(1, 1000),
            Field<C>{"resume", &C::resume, "continue from the newest valid checkpoint in checkpoint_dir"},
            Field<C>{"log_every", &C::log_every, "steps between log lines when stdout is not a terminal"}.in(1, steps_max),
            Field<C>{"threads", &C::threads, "OpenMP threads (0: all cores); results are deterministic for a given count"}.in(0, 1024),
            Field<C>{"data_parallel", &C::data_parallel,
                     "with several threads, split each batch's rows over them (one forward/backward per thread) instead of each op"},
            Field<C>{"dry_run", &C::dry_run, "check the flags, read the data, build the model and load the checkpoint, then stop"},
            Field<C>{"plot", &C::plot, "draw loss.png at the end (python3 with matplotlib)"},
            Field<C>{"time_budget_s", &C::time_budget_s, "stop after the step that reaches this many seconds of training (0: off), "
                                                         "then evaluate and checkpoint"}.in(0, 1e9),
            Field<C>{"world_size", &C::world_size, "processes training together (data parallel; each takes batch / world_size rows)"}
                .in(1, 1 << 16),
            Field<C>{"rank", &C::rank, "this process's rank in [0, world_size); rank 0 writes checkpoints and metrics"}.in(0, 1 << 16),
            Field<C>{"device", &C::device,
                     "where the training steps run: cpu (olmax's kernels) or xla (forward, backward and AdamW compiled once as one "
                     "StableHLO program for a PJRT plugin, state kept on the device)",
                     {"cpu", "xla"}},
            Field<C>{"xla_plugin", &C::xla_plugin, "PJRT plugin (.so) for --device=xla; empty: the environment variable OLMAX_PJRT_PLUGIN"},
            Field<C>{"xla_devices", &C::xla_devices,
                     "--device=xla: data parallelism over the plugin's first N devices (XLA's SPMD partitioner splits the batch, each "
                     "device taking batch / xla_devices rows; the gradients are all-reduced inside the step)"}
                .in(1, 1 << 16),
            Field<C>{"precision", &C::precision,
                     "fp32, or bf16: every float GEMM (forward and backward) computes as bf16 matrix units do, operands rounded to "
                     "bfloat16 and fp32 sums (on oneDNN's bf16 kernels when built with it and the CPU has bf16 units); "
                     "parameters, optimiser state, norms, softmax, losses and scans stay fp32 (docs/BF16.md)",
                     {"fp32", "bf16"}},
            Field<C>{"kept_layers", &C::kept_layers,
                     "recompute as a budget: the first N reversible blocks keep their activations for the backward instead of "
                     "rebuilding them from their outputs (faster, more memory: each shard thread keeps its own; more than depth "
                     "keeps all; the CPU path only)"}
                .in(0, 1 << 12),
            Field<C>{"rendezvous", &C::rendezvous, "how the processes find each other: file:DIR (a folder all can reach) or "
                                                   "tcp:HOST:PORT (rank 0 listens there)"},
            Field<C>{"collective_timeout_s", &C::collective_timeout_s, "a peer silent this long is an error (rendezvous and every "
                                                                       "gradient exchange)"}.greater_than(0).at_most(1e6),
            Field<C>{"overlap_allreduce", &C::overlap_allreduce,
                     "with world_size > 1, send each bucket of gradients to the other processes as soon as backward has finished it, "
                     "from a thread of its own, instead of all after backward (the same result, bit for bit; docs/DISTRIBUTED.md)"},
            Field<C>{"bucket_mb", &C::bucket_mb, "with world_size > 1, MiB of gradients exchanged per collective (smaller: more "
                                                 "collectives, each of which can start earlier with --overlap_allreduce)"}.greater_than(0).at_most(1e6),
            Field<C>{"sample_bytes", &C::sample_bytes, "bytes to generate after training"}.in(0, size_max),
            Field<C>{"temperature", &C::temperature, "sampling temperature (0: greedy)"}.in(0, 100),
            Field<C>{"top_k", &C::top_k, "sample among the k most likely bytes (0: all)"}.in(0, 256),
            Field<C>{"top_p", &C::top_p, "nucleus sampling mass"}.greater_than(0).at_most(1),
            Field<C>{"prompt", &C::prompt, "text the samples start from"},
        };
        return f;
    }

    /// Every key in its declared range and path kind (see fields()), plus the checks that span
    /// keys; errors name the key.
    void validate() const {
        validate_fields(*this);
        check<config_error>(min_lr <= lr, "config: key 'min_lr' (", min_lr, ") must not exceed 'lr' (", lr, ")");
        if (device == "xla") {
            check<config_error>(precision == "fp32", "config: --precision=bf16 is not lowered for --device=xla yet; use --device=cpu or fp32");
            check<config_error>(grad_accumulation == 1 && world_size == 1 && agc_clip == 0,
                                "config: --device=xla runs one whole step per batch in one process without AGC; it needs grad_accumulation=1, "
                                "world_size=1 and agc_clip=0 (got ", grad_accumulation, ", ", world_size, " and ", agc_clip, ")");
            check<config_error>(batch % xla_devices == 0, "config: key 'batch' (", batch, ") must be a multiple of 'xla_devices' (",
                                xla_devices, ")");
        }
        check<config_error>(!update_in_backward || (world_size == 1 && device == "cpu"),
                            "config: --update_in_backward needs one process (world_size=1: gradients are exchanged before any update) and "
                            "device=cpu (got world_size=", world_size, ", device=", device, ")");
        check<config_error>(!update_in_backward || max_grad_norm == 0 || grad_accumulation == 1,
                            "config: --update_in_backward with global-norm clipping (max_grad_norm=", max_grad_norm,
                            ") runs backward twice, the first run only measuring the norm, so the gradients of earlier micro-batches "
                            "cannot be kept: set grad_accumulation=1 (got ", grad_accumulation, ") or max_grad_norm=0");
        check<config_error>(rank < world_size, "config: key 'rank' (", rank, ") must be below 'world_size' (", world_size, ")");
        check<config_error>(batch % world_size == 0, "config: key 'batch' (", batch, ") must be a multiple of 'world_size' (", world_size,
                            "): every process takes an equal share of each batch's rows");
        check<config_error>(world_size == 1 || !rendezvous.empty(), "config: world_size ", world_size,
                            " needs --rendezvous=file:DIR or --rendezvous=tcp:HOST:PORT");
    }

    /// The sizes of a preset (keys preset, features, depth, batch, sequence) over the defaults;
    /// a program applies it first and the explicit flags after it.
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
        throw config_error(olmax::detail::concat("config: key 'preset' must be tiny, small or base, got '", name, "'"));
    }
};

/// parse_command_line for a TrainConfig with presets: the flags (and --config file) are read once
/// to find the preset, then applied again over that preset's sizes, so explicit keys win.
inline CommandLine parse_train_command_line(TrainConfig& c, int argc, const char* const* argv) {
    TrainConfig scratch = c;
    const CommandLine first = parse_command_line(scratch, argc, argv);
    if (first.help) return first;
    c = TrainConfig::with_preset(scratch.preset);
    return parse_command_line(c, argc, argv);
}

}  // namespace olmax::config
