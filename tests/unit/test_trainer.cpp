// olmax::train::Trainer and its host step on a model of the test's own (a bigram table): gradient
// accumulation against one batch of both micro-batches, resume against an uninterrupted run (bit
// for bit), divergence, the time budget, a stop request, bad settings, and the precision (bf16 GEMMs)
// and threads the Trainer applies itself.

#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace {
using olmax_test::TempDir;
using olmax_test::same_bits;

namespace train = olmax::train;
using olmax::Tensor;

/// logits(next byte | byte) = table[byte]: the smallest model the Trainer can train.
struct Bigram {
    using value_type = float;
    Tensor<float> table;
    int poison_at_call = 0;  // > 0: the loss of this call of accumulate_gradients is NaN
    int calls = 0;

    explicit Bigram(std::uint64_t seed) {
        olmax::Generator rng(seed);
        table = olmax::randn<float>({256, 256}, rng, 0.0f, 0.1f);
        table.set_requires_grad(true);
    }
    std::vector<olmax::optim::Parameter<float>> parameters() { return {{"table", olmax::nn::Role::weight, table}}; }

    double accumulate_gradients(const olmax::data::Batch& batch, std::size_t /*shards*/, double scale) {
        olmax::autodiff::tape_scope tape;
        const std::size_t n = batch.inputs.size();
        auto logits = olmax::reshape(olmax::embedding(table, batch.inputs), olmax::Shape{n, 256});
        auto loss = olmax::cross_entropy(logits, Tensor<std::int32_t>::from(olmax::Shape{n}, batch.targets.span()));
        if (++calls == poison_at_call) loss = loss * std::numeric_limits<float>::quiet_NaN();
        const double value = double(loss.item());
        (loss * float(scale)).backward();
        return value;
    }

    std::pair<double, double> masked_nll(const olmax::data::Batch& batch) const {
        double total = 0, count = 0;
        for (std::size_t i = 0; i < batch.targets.size(); ++i) {
            if (batch.mask.data()[i] == 0.0f) continue;
            const float* row = table.data() + std::size_t(batch.inputs.data()[i]) * 256;
            double sum = 0;
            for (std::size_t v = 0; v < 256; ++v) sum += std::exp(double(row[v]));
            total += std::log(sum) - double(row[batch.targets.data()[i]]);
            count += 1;
        }
        return {total, count};
    }
};

static_assert(train::TrainableModel<Bigram>);
static_assert(train::TrainableModel<olmax::models::ByteLM<olmax::models::ConvMixer>>);
static_assert(!train::TrainableModel<int>);

olmax::optim::AdamWConfig adam() {
    olmax::optim::AdamWConfig o;
    o.schedule = olmax::optim::LrSchedule{1e-2, 2, 0.0, -1, 0.0};
    return o;
}

train::TrainerOptions options(const std::filesystem::path& dir, std::int64_t steps) {
    train::TrainerOptions o;
    o.steps = steps, o.batch = 4, o.sequence = 16, o.seed = 5;
    o.eval_every = 2, o.eval_batches = 2, o.checkpoint_every = 3, o.checkpoint_dir = dir.string();
    o.config_text = "model = bigram\n";
    return o;
}

/// Records the losses the Trainer reports.
struct Recorder final : train::Observer {
    std::vector<double> losses, evaluations;
    std::vector<std::string> notes;
    std::vector<double> learning_rates;  // each step's report: the next step's rate
    std::int64_t stop_after = 0;         // > 0: request a stop when this step is reported (the run ends after the next)
    bool ended = false;
    void note(std::string_view line) override { notes.emplace_back(line); }
    void finished() override { ended = true; }
    void step_finished(const train::StepReport& r) override {
        losses.push_back(r.loss);
        learning_rates.push_back(r.learning_rate);
        if (r.step == stop_after) olmax::request_stop();
    }
    void evaluated(std::int64_t, double loss) override { evaluations.push_back(loss); }
};

struct TrainerRun {
    Bigram model{11};
    olmax::optim::AdamW<float> opt;
    olmax::distributed::LocalCommunicator comm;
    Recorder recorder;
    train::Trainer<Bigram> trainer;
    explicit TrainerRun(train::TrainerOptions o, train::HostStepOptions step = {}, olmax::optim::AdamWConfig config = adam())
        : opt(model.parameters(), config),
          trainer(model, opt, comm, olmax_test::tiny_corpus(), olmax_test::tiny_corpus(), std::move(o),
                  std::make_unique<train::HostStep<Bigram>>(step), recorder) {}
};

}  // namespace

TEST_CASE("train: two accumulated micro-batches step as one batch of both", "[train]") {
    olmax::data::PackedLoader loader(olmax_test::tiny_corpus(), {4, 16, 1, true, true});
    const auto both = *loader.next();
    olmax::distributed::LocalCommunicator comm;
    auto one_step = [&](std::int64_t micro_batches, const std::vector<olmax::data::Batch>& feed) {
        auto model = std::make_unique<Bigram>(3);
        olmax::optim::AdamW<float> opt(model->parameters(), adam());
        train::HostStep<Bigram> step(train::HostStepOptions{.grad_accumulation = micro_batches, .data_parallel = false});
        step.prepare({*model, opt, comm});
        std::size_t next = 0;
        const double loss = step.compute([&] { return feed.at(next++); }).loss;
        step.update();
        CHECK(next == feed.size());
        return std::make_pair(loss, model->table.clone());
    };
    const auto [whole_loss, whole] = one_step(1, {both});
    const auto [split_loss, split] = one_step(2, {olmax::data::batch_rows(both, 0, 2), olmax::data::batch_rows(both, 2, 4)});
    CHECK(split_loss == Approx(whole_loss).epsilon(1e-6));
    CHECK(olmax_test::max_abs_diff(whole, split) < 1e-6);
    const auto [first_loss, first_half_only] = one_step(1, {olmax::data::batch_rows(both, 0, 2)});
    CHECK(olmax_test::max_abs_diff(whole, first_half_only) > 1e-4);  // the test sees a difference where there is one
}

TEST_CASE("train: a run resumed from its checkpoint continues bit for bit as the uninterrupted run", "[train]") {
    TempDir straight_dir("straight"), resumed_dir("resumed");
    TrainerRun straight(options(straight_dir.path, 6));
    const auto straight_result = straight.trainer.run();
    CHECK(straight_result.step == 6);
    CHECK(straight.recorder.losses.size() == 6);

    {
        TrainerRun first(options(resumed_dir.path, 3));  // stops at 3: the checkpoint after the last step
        CHECK(first.trainer.run().last_checkpoint.filename() == "ckpt-0000000003.olmax");
    }
    TrainerRun second(options(resumed_dir.path, 6));
    CHECK(second.trainer.prepare() == 3);
    const auto resumed_result = second.trainer.run();
    CHECK(resumed_result.step == 6);
    REQUIRE(second.recorder.losses.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(second.recorder.losses[i] == straight.recorder.losses[3 + i]);
    CHECK(same_bits(second.model.table, straight.model.table));
    CHECK(resumed_result.last_evaluation == straight_result.last_evaluation);

    TrainerRun refused([&] {
        auto o = options(resumed_dir.path, 9);
        o.resume = false;
        return o;
    }());
    CHECK_THROWS_WITH(refused.trainer.prepare(), Catch::Contains("checkpoints of an earlier run"));
}

TEST_CASE("train: a NaN loss ends the run with training_diverged naming the last good checkpoint", "[train]") {
    TempDir dir("diverged");
    TrainerRun run(options(dir.path, 10));
    run.model.poison_at_call = 5;
    try {
        run.trainer.run();
        FAIL("no training_diverged");
    } catch (const train::training_diverged& e) {
        CHECK_THAT(e.what(), Catch::Contains("the loss is nan at step 5"));
        CHECK(e.last_checkpoint().filename() == "ckpt-0000000003.olmax");
    }
    CHECK(run.trainer.step() == 4);
    CHECK(run.recorder.losses.size() == 4);
}

TEST_CASE("train: the time budget and a stop request end the run after the current step", "[train]") {
    TempDir dir("budget");
    auto o = options(dir.path, 50);
    o.time_budget_s = 1e-9;  // reached by the first step
    TrainerRun run(o);
    const auto result = run.trainer.run();
    CHECK(result.out_of_time);
    CHECK(run.recorder.learning_rates.back() == 1e-2);  // an exponential schedule with no decay ignores the budget
    CHECK(result.step == 1);
    CHECK(std::isfinite(result.last_evaluation));  // the last step is evaluated ...
    CHECK(result.last_checkpoint.filename() == "ckpt-0000000001.olmax");  // ... and saved
    CHECK(run.recorder.ended);
    REQUIRE_FALSE(run.recorder.notes.empty());
    CHECK_THAT(run.recorder.notes.back(), Catch::Contains("time budget of 0 s reached after step 1"));

    TempDir stop_dir("stop");
    TrainerRun stopped(options(stop_dir.path, 50));
    olmax::request_stop();
    const auto stop_result = stopped.trainer.run();
    olmax::clear_stop_request();
    CHECK(stop_result.stop.stop);
    CHECK(stop_result.step == 1);
    CHECK(stopped.recorder.evaluations.empty());  // a stop skips the final evaluation, not the checkpoint
    CHECK(stop_result.last_checkpoint.filename() == "ckpt-0000000001.olmax");
}

TEST_CASE("train: a cosine schedule decays over the run's steps, or over its time budget when that ends it, and resumes where it was", "[train]") {
    auto cosine = adam();
    cosine.schedule.decay = olmax::optim::LrDecay::cosine;
    cosine.schedule.min_lr = 1e-3;
    // Over the steps: the Trainer reports the fraction done, so step s of 8 (after 2 of warmup)
    // runs at the schedule's rate at progress s / 8.
    TempDir straight_dir("cosine");
    TrainerRun straight(options(straight_dir.path, 8), {}, cosine);
    straight.trainer.run();
    REQUIRE(straight.recorder.learning_rates.size() == 8);
    for (std::size_t i = 0; i < 8; ++i) {
        const double progress = double(i + 1) / 8.0;  // reported after step i + 1, for step i + 2
        CHECK(straight.recorder.learning_rates[i] == Approx(1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + std::cos(M_PI * progress))));
    }
    CHECK(straight.recorder.learning_rates[3] == Approx(0.5 * (1e-2 + 1e-3)));  // half way: the mean of peak and floor
    CHECK(straight.recorder.learning_rates.back() == Approx(1e-3));

    // Stopped after step 3 and resumed, the schedule goes on where it was: the same rates and the
    // same weights.
    TempDir resumed_dir("cosine_resumed");
    {
        TrainerRun first(options(resumed_dir.path, 8), {}, cosine);
        first.recorder.stop_after = 2;
        const auto stopped = first.trainer.run();
        olmax::clear_stop_request();
        CHECK(stopped.last_checkpoint.filename() == "ckpt-0000000003.olmax");
    }
    TrainerRun second(options(resumed_dir.path, 8), {}, cosine);
    second.trainer.run();
    REQUIRE(second.recorder.learning_rates.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) CHECK(second.recorder.learning_rates[i] == Approx(straight.recorder.learning_rates[i + 3]));
    CHECK(same_bits(second.model.table, straight.model.table));

    // A time budget that ends the run first ends the decay with it.
    TempDir budget_dir("cosine_budget");
    auto o = options(budget_dir.path, 1000);
    o.time_budget_s = 1e-9;
    TrainerRun budgeted(o, {}, cosine);
    CHECK(budgeted.trainer.run().out_of_time);
    CHECK(budgeted.recorder.learning_rates.back() == Approx(1e-3));
}

TEST_CASE("train: bad settings are refused with a plain message", "[train]") {
    TempDir dir("bad");
    auto o = options(dir.path, 5);
    o.eval_every = 0;
    CHECK_THROWS_WITH(TrainerRun(o), Catch::Contains("eval_every"));
    CHECK_THROWS_WITH(train::HostStep<Bigram>(train::HostStepOptions{.grad_accumulation = 0}), Catch::Contains("grad_accumulation must be at least 1"));
    Bigram model(1);
    olmax::optim::AdamW<float> opt(model.parameters(), adam());
    olmax::distributed::LocalCommunicator comm;
    Recorder recorder;
    CHECK_THROWS_WITH(train::Trainer<Bigram>(model, opt, comm, olmax_test::tiny_corpus(), {}, options(dir.path, 5),
                                             std::make_unique<train::HostStep<Bigram>>(train::HostStepOptions{}), recorder),
                      Catch::Contains("no held-out documents"));
}

namespace {
using TrainerPrecisionModel = olmax::models::ByteLM<olmax::models::ConvMixer>;  // GEMMs in its layers and head

/// What a Trainer run of a tiny ByteLM reports, and a product computed through its with_precision.
struct TrainerPrecisionResult {
    std::vector<double> losses, evaluations;
    std::vector<std::string> notes;
    Tensor<float> product;
};

/// Four steps (two evaluations) of a tiny ByteLM with TrainerOptions::precision `precision`, one
/// thread and no data-parallel shards, so that two runs at one precision agree bit for bit.
TrainerPrecisionResult trainer_precision_run(const std::string& precision, const std::string& folder) {
    TempDir dir(folder);
    TrainerPrecisionModel model(olmax::models::ByteLMConfig{.features = 8, .depth = 1, .seed = 1});
    olmax::optim::AdamW<float> opt(model.parameters(), adam());
    olmax::distributed::LocalCommunicator comm;
    Recorder recorder;
    auto o = options(dir.path, 4);
    o.precision = precision, o.config_text = "model = byte_lm\n";
    train::Trainer trainer(model, opt, comm, olmax_test::tiny_corpus(), olmax_test::tiny_corpus(), o,
                           std::make_unique<train::HostStep<TrainerPrecisionModel>>(train::HostStepOptions{.data_parallel = false}),
                           recorder);
    trainer.run();
    olmax::Generator rng(3);
    const auto a = olmax::randn<float>({6, 40}, rng), b = olmax::randn<float>({40, 5}, rng);
    return {recorder.losses, recorder.evaluations, recorder.notes, trainer.with_precision([&] { return olmax::matmul(a, b); })};
}

double trainer_precision_max_relative_difference(const std::vector<double>& x, const std::vector<double>& y) {
    REQUIRE(x.size() == y.size());
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / std::abs(y[i]));
    return worst;
}
}  // namespace

TEST_CASE("train: a Trainer asked for bf16 computes its GEMMs in bf16, as inside an explicit bf16_matmul_scope", "[train][bf16]") {
    const auto fp32 = trainer_precision_run("fp32", "precision_fp32");
    const auto bf16 = trainer_precision_run("bf16", "precision_bf16");
    REQUIRE(fp32.losses.size() == 4);
    REQUIRE(fp32.evaluations.size() == 2);
    // bf16 operands (8 significant bits) move the losses far beyond fp32's rounding (~1e-7).
    CHECK(trainer_precision_max_relative_difference(bf16.losses, fp32.losses) > 1e-5);
    CHECK(trainer_precision_max_relative_difference(bf16.evaluations, fp32.evaluations) > 1e-5);
    CHECK(olmax_test::max_abs_diff(bf16.product, fp32.product) > 1e-4);  // with_precision too
    // The oneDNN product says what it runs on; the portable one says so itself, once, on stderr.
    const bool noted = std::any_of(bf16.notes.begin(), bf16.notes.end(), [](const std::string& n) { return n.starts_with("precision bf16: GEMMs on"); });
    CHECK(noted == train::links_onednn);
    if constexpr (!train::links_onednn) {  // with oneDNN linked, the fp32 run's own scope would take the float GEMMs back
        // A program's own scope around an fp32 Trainer: the same bf16 product, so the same numbers, bit for bit.
        olmax::backend::bf16_matmul_scope scope;
        const auto explicit_bf16 = trainer_precision_run("fp32", "precision_explicit");
        CHECK(explicit_bf16.losses == bf16.losses);
        CHECK(explicit_bf16.evaluations == bf16.evaluations);
        CHECK(same_bits(explicit_bf16.product, bf16.product));
    }
}

TEST_CASE("train: the Trainer sets the OpenMP threads of its options in prepare()", "[train]") {
    const int before = olmax::backend::host_kernels().num_threads();
    const std::int64_t wanted = before == 1 ? 2 : 1;
    TempDir dir("threads");
    auto o = options(dir.path, 1);
    o.threads = wanted;
    TrainerRun run(o);
    run.trainer.prepare();
    const int during = olmax::backend::host_kernels().num_threads();
    train::set_threads(before);
#if defined(_OPENMP)
    CHECK(during == wanted);
#else
    CHECK(during == before);  // no OpenMP: one thread, whatever is asked
#endif
    o.precision = "fp16";
    CHECK_THROWS_WITH(TrainerRun(o), Catch::Contains("precision must be fp32 or bf16"));
}

TEST_CASE("train: TrainConfig composes the modules' sections, each key once, and reads the text checkpoints stored before", "[train][config]") {
    namespace config = olmax::config;
    using olmax::train::TrainConfig;
    std::vector<std::string> keys;
    for (const auto& f : TrainConfig::fields()) keys.push_back(f.key);
    CHECK(keys.size() == 56);
    auto sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    for (const auto& f : train::HostStepOptions::fields()) CHECK(std::find(keys.begin(), keys.end(), f.key) != keys.end());
    for (const auto& f : train::LoopConfig::fields()) CHECK(std::find(keys.begin(), keys.end(), f.key) != keys.end());

    // A key set through the composition lands in its section's member.
    TrainConfig c;
    config::set_value(c, "grad_accumulation", "3", "test");
    config::set_value(c, "checkpoint_every", "7", "test");
    CHECK(static_cast<const train::HostStepOptions&>(c).grad_accumulation == 3);
    CHECK(static_cast<const train::LoopConfig&>(c).checkpoint_every == 7);

    // The config text of a checkpoint written by the single TrainConfig of olmax::config (its key
    // order, and xla_replicas, an older name of xla_devices).
    const std::string before =
        "data = README.md\nheld_out_fraction = 0.05\nseed = 0\nbatch = 2\nsequence = 16\npreset = tiny\nblock = qrnn\nfeatures = 8\n"
        "depth = 1\nsteps = 6\ngrad_accumulation = 1\nlr = 0.003\nwarmup = 50\nlr_decay = 0.0001\ndecay_start = -1\nmin_lr = 0\n"
        "beta1 = 0.9\nbeta2 = 0.99\neps = 1e-08\nweight_decay = 0.01\ndecay_policy = matrices\nagc_clip = 0\nmax_grad_norm = 1\n"
        "update_in_backward = false\neval_every = 2\neval_batches = 1\ncheckpoint_every = 2\ncheckpoint_dir = /tmp/tl0\n"
        "keep_checkpoints = 3\nresume = true\nlog_every = 1\nthreads = 1\ndata_parallel = true\ndry_run = false\nplot = false\n"
        "time_budget_s = 0\nworld_size = 1\nrank = 0\ndevice = cpu\nxla_plugin = \"\"\nxla_replicas = 2\nprecision = fp32\n"
        "kept_layers = 0\nrendezvous = \"\"\ncollective_timeout_s = 1.2e+02\noverlap_allreduce = true\nbucket_mb = 25\n"
        "sample_bytes = 20\ntemperature = 0.8\ntop_k = 0\ntop_p = 0.95\nprompt = \"The \"\n";
    TrainConfig saved;
    config::load_text(saved, before, "an older checkpoint's config");
    CHECK(saved.block == "qrnn");
    CHECK(saved.xla_devices == 2);
    CHECK(saved.checkpoint_dir == "/tmp/tl0");
    CHECK(saved.prompt == "The ");
    CHECK(saved.lr_schedule == "exponential");  // stored before the key existed: the schedule it ran with
    CHECK(saved.decode == "stepwise");  // stored before the key existed: its default
    TrainConfig again;
    config::load_text(again, config::to_text(saved));
    CHECK(config::to_text(again) == config::to_text(saved));
    CHECK(train::trainer_options(saved).checkpoint_every == 2);
}

TEST_CASE("train: a preset sets its keys and explicit flags win; speedrun is the speedrun's recipe", "[train][config]") {
    using olmax::train::TrainConfig;
    auto parsed = [](std::vector<const char*> flags) {
        flags.insert(flags.begin(), "train_lm");
        TrainConfig c;
        olmax::train::parse_train_command_line(c, int(flags.size()), flags.data());
        return c;
    };
    const TrainConfig small = parsed({"--preset=small", "--depth=3"});
    CHECK(small.features == 128);
    CHECK(small.depth == 3);  // given explicitly
    CHECK(small.sequence == 128);
    CHECK(small.block == TrainConfig{}.block);
    const TrainConfig speedrun = parsed({"--preset=speedrun", "--block=mamba2"});
    CHECK(speedrun.block == "mamba2");  // given explicitly
    CHECK(speedrun.features == TrainConfig{}.features);
    CHECK(speedrun.sequence == 128);
    CHECK(speedrun.lr_schedule == "cosine");
    CHECK(speedrun.lr == 0.008);
    CHECK(speedrun.time_budget_s == 300);
    CHECK(speedrun.steps > 1'000'000);  // the budget, not the steps, ends the run
    CHECK(parsed({"--preset=speedrun"}).block == "hybrid");
    CHECK_THROWS_WITH(TrainConfig::with_preset("huge"), Catch::Matchers::Contains("tiny, small, base or speedrun"));
}

TEST_CASE("train: the optimiser keys' defaults are optim::AdamWConfig::language_model(), the library's recipe", "[train][config]") {
    const olmax::optim::AdamWConfig made = olmax::train::optimizer_config(olmax::train::OptimizerConfig{});
    const auto recipe = olmax::optim::AdamWConfig::language_model();
    CHECK(made.beta1 == recipe.beta1);
    CHECK(made.beta2 == recipe.beta2);
    CHECK(made.eps == recipe.eps);
    CHECK(made.weight_decay == recipe.weight_decay);
    CHECK(made.decay_policy == recipe.decay_policy);
    CHECK(made.agc.clip == recipe.agc.clip);
    CHECK(made.max_grad_norm == recipe.max_grad_norm);
    CHECK(made.moments == recipe.moments);
    // The recipe is not the plain optimiser (beta2 0.999, no decay, no clipping, float64 moments).
    const olmax::optim::AdamWConfig plain{};
    CHECK(recipe.beta2 != plain.beta2);
    CHECK(recipe.max_grad_norm != plain.max_grad_norm);
    CHECK(recipe.moments != plain.moments);
    for (auto m : {olmax::optim::MomentPrecision::float64, olmax::optim::MomentPrecision::float32, olmax::optim::MomentPrecision::bfloat16})
        CHECK(olmax::optim::parse_moment_precision(olmax::optim::to_string(m)) == m);
    CHECK_THROWS_WITH(olmax::optim::parse_moment_precision("fp16"), Catch::Contains("expected fp64, fp32 or bf16"));
}

TEST_CASE("models: ByteLM keeps as many layers' activations as fit half the free memory when kept_layers is -1", "[train][models]") {
    olmax::models::ByteLMConfig config;
    config.features = 64;
    config.depth = 6;
    olmax::models::ByteLM<> model(config);
    using Model = olmax::models::ByteLM<>;
    const std::size_t batch = 8, sequence = 256, shards = 2;
    // Explicit counts are taken as they are (more than depth keeps all).
    CHECK(model.keep_activations(3, batch, sequence, shards) == 3);
    CHECK(model.keep_activations(0, batch, sequence, shards) == 0);
    CHECK(model.keep_activations(100, batch, sequence, shards) == 6);
    CHECK_THROWS_WITH(model.keep_activations(-2, batch, sequence, shards), Catch::Contains("-1 (chosen from memory) or >= 0"));
    // -1: what one shard's layer holds (measured as the model does), and a memory limit at which
    // exactly two such layers per shard fit half of what is left beyond the model's estimate.
    Tensor<float> probe;
    {
        olmax::autodiff::no_grad off;
        probe = olmax::nn::two_streams(Tensor<float>({batch / shards, sequence, config.features}, 0.01f));
    }
    const double per_layer = double(model.stack.activation_bytes_per_layer(probe));
    REQUIRE(per_layer > double(1 << 20));  // the limit below is in MiB: a layer must be larger
    const double estimate = Model::estimated_training_bytes(config, batch, sequence);
    struct restore_limit {  // the variable as it was before the test
        const char* was = std::getenv("OLMAX_MEMORY_LIMIT_MIB");
        std::string value = was ? was : "";
        ~restore_limit() {
            if (was) setenv("OLMAX_MEMORY_LIMIT_MIB", value.c_str(), 1);
            else unsetenv("OLMAX_MEMORY_LIMIT_MIB");
        }
    } restore;
    auto with_limit_mib = [&](double mib) {
        setenv("OLMAX_MEMORY_LIMIT_MIB", std::to_string(static_cast<unsigned long long>(std::ceil(mib))).c_str(), 1);
        return model.keep_activations(-1, batch, sequence, shards);
    };
    CHECK(with_limit_mib((estimate + 2.0 * double(shards) * 2.5 * per_layer) / double(1 << 20)) == 2);
    CHECK(with_limit_mib(estimate / double(1 << 20) / 2) == 0);  // not even the model fits: every layer rebuilt
    CHECK(with_limit_mib((estimate + 2.0 * double(shards) * 100 * per_layer) / double(1 << 20)) == 6);
    CHECK(model.stack.kept_activations() == 6);
}
