#pragma once
// The training run's settings (examples/train_lm), with defaults sized for a few minutes on 2 CPU
// cores. Printed at start and stored in every checkpoint (`to_text`).

#include <cstdint>
#include <string>
#include <vector>

#include "olmax/config/key_value.hpp"
#include "olmax/optim/adam.hpp"

namespace olmax::config {

struct TrainConfig {
    // data
    std::string data;  // file or folder; empty = the default corpus (Debian package fortunes)
    double held_out_fraction = 0.05;
    std::int64_t seed = 0;
    std::int64_t batch = 8;
    std::int64_t sequence = 64;
    // model
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
    // sampling at the end
    std::int64_t sample_bytes = 200;
    double temperature = 0.8;
    std::int64_t top_k = 0;
    double top_p = 0.95;
    std::string prompt = "The ";

    static const std::vector<Field<TrainConfig>>& fields() {
        using C = TrainConfig;
        static const std::vector<Field<C>> f{
            {"data", &C::data, "text file or folder to train on (empty: the Debian `fortunes` corpus)"},
            {"held_out_fraction", &C::held_out_fraction, "fraction of documents held out for evaluation"},
            {"seed", &C::seed, "seed for initialisation, data order and sampling"},
            {"batch", &C::batch, "rows per step (each row is a packed stream of documents)"},
            {"sequence", &C::sequence, "bytes per row per step"},
            {"features", &C::features, "model width"},
            {"depth", &C::depth, "number of blocks"},
            {"steps", &C::steps, "optimiser steps"},
            {"grad_accumulation", &C::grad_accumulation, "micro-batches summed per optimiser step"},
            {"lr", &C::lr, "peak learning rate"},
            {"warmup", &C::warmup, "linear warmup steps"},
            {"lr_decay", &C::lr_decay, "exponential decay rate per step after decay_start"},
            {"decay_start", &C::decay_start, "first decayed step (-1: end of warmup)"},
            {"min_lr", &C::min_lr, "floor of the decayed learning rate"},
            {"beta1", &C::beta1, "Adam first-moment decay"},
            {"beta2", &C::beta2, "Adam second-moment decay"},
            {"eps", &C::eps, "Adam epsilon"},
            {"weight_decay", &C::weight_decay, "decoupled weight decay"},
            {"decay_policy", &C::decay_policy, "which parameter roles are decayed", {"matrices", "embeddings_only", "all", "none"}},
            {"agc_clip", &C::agc_clip, "unit-wise adaptive gradient clipping ratio (0: off)"},
            {"max_grad_norm", &C::max_grad_norm, "global gradient-norm clip (0: off)"},
            {"eval_every", &C::eval_every, "steps between held-out evaluations"},
            {"eval_batches", &C::eval_batches, "held-out batches per evaluation"},
            {"checkpoint_every", &C::checkpoint_every, "steps between checkpoints"},
            {"checkpoint_dir", &C::checkpoint_dir, "folder for checkpoints, metrics.csv and loss.png"},
            {"keep_checkpoints", &C::keep_checkpoints, "checkpoints kept in checkpoint_dir"},
            {"resume", &C::resume, "continue from the newest valid checkpoint in checkpoint_dir"},
            {"log_every", &C::log_every, "steps between log lines when stdout is not a terminal"},
            {"threads", &C::threads, "OpenMP threads (0: all cores); results are deterministic for a given count"},
            {"data_parallel", &C::data_parallel,
             "with several threads, split each batch's rows over them (one forward/backward per thread) instead of each op"},
            {"sample_bytes", &C::sample_bytes, "bytes to generate after training"},
            {"temperature", &C::temperature, "sampling temperature (0: greedy)"},
            {"top_k", &C::top_k, "sample among the k most likely bytes (0: all)"},
            {"top_p", &C::top_p, "nucleus sampling mass"},
            {"prompt", &C::prompt, "text the samples start from"},
        };
        return f;
    }

    /// Range checks that types alone cannot express; errors name the key.
    void validate() const {
        auto positive = [](std::int64_t v, const char* key) {
            check<config_error>(v > 0, "config: key '", key, "' must be positive, got ", v);
        };
        positive(batch, "batch");
        positive(sequence, "sequence");
        positive(features, "features");
        positive(depth, "depth");
        positive(steps, "steps");
        positive(grad_accumulation, "grad_accumulation");
        positive(eval_batches, "eval_batches");
        positive(keep_checkpoints, "keep_checkpoints");
        check<config_error>(held_out_fraction > 0 && held_out_fraction < 1, "config: key 'held_out_fraction' must be in (0, 1), got ",
                            held_out_fraction);
        check<config_error>(lr > 0, "config: key 'lr' must be positive, got ", lr);
        check<config_error>(warmup >= 0 && threads >= 0 && top_k >= 0 && sample_bytes >= 0,
                            "config: warmup, threads, top_k and sample_bytes must be >= 0");
        check<config_error>(lr_decay >= 0 && lr_decay < 1, "config: key 'lr_decay' must be in [0, 1), got ", lr_decay);
        check<config_error>(top_p > 0 && top_p <= 1, "config: key 'top_p' must be in (0, 1], got ", top_p);
        check<config_error>(temperature >= 0, "config: key 'temperature' must be >= 0, got ", temperature);
    }

    optim::AdamWConfig optimizer_config() const {
        optim::AdamWConfig c;
        c.schedule = optim::LrSchedule{lr, warmup, lr_decay, decay_start, min_lr};
        c.beta1 = beta1;
        c.beta2 = beta2;
        c.eps = eps;
        c.weight_decay = weight_decay;
        c.decay_policy = optim::parse_weight_decay_policy(decay_policy);
        c.agc.clip = agc_clip;
        c.max_grad_norm = max_grad_norm;
        return c;
    }
};

}  // namespace olmax::config
