#pragma once
// The cases of tests/distributed, written against the Communicator interface only, so that every
// communicator runs the same checks: test_distributed.cpp runs them over Gloo, test_distributed_mpi.cpp
// over MPI. Each case is one rank's part; a failed check throws `Failure`.
//
//   case_collectives  allreduce (sum, mean; float, double; 0, 1, odd, ~4M elements) equals
//                     reduce_in_rank_order of every rank's input bit for bit; broadcast from every
//                     root; barrier; the bucketing of plan_buckets; LocalCommunicator.
//   case_train        a tiny MLP trained for a few AdamW steps, one shard of each batch per rank,
//                     with broadcast_parameters at the start and allreduce_gradients after each
//                     backward, ends bit-identical to one process averaging the shard gradients (and
//                     across bucket sizes).
//   case_peer_exit    rank 1 dies (_Exit, no clean-up) before an allreduce: rank 0 must get a
//                     distributed_error naming the allreduce and rank 0 within timeout + 3 s.
//   case_peer_hang    rank 1 sleeps past the timeout: rank 0 must time out within timeout + 3 s;
//                     rank 1, waking up, must get an error too (over MPI the job is aborted while
//                     rank 1 still sleeps: run_mpi.sh checks that instead).
//   case_overlap      OverlappedAllreduce (the exchange during backward) gives exactly what
//                     backward then allreduce_gradients gives: every gradient, bit for bit, and the
//                     has-gradient flags (a parameter used on one rank per step, one used by none),
//                     for buckets of 1 byte (each gradient alone), 100 bytes and 25 MiB, in float
//                     and double, with backward on one thread and over data_parallel_backward shards,
//                     over 5 steps (the first on the initial bucket plan, the rest on the learned one).
//   case_overlap_peer_exit  rank 1 dies in the middle of its backward, after some buckets left:
//                     rank 0's step must throw distributed_error within timeout + 3 s.
//   case_overlap_abandon    rank 1's backward throws: rank 1 gets that exception and its reducer
//                     refuses the next step; rank 0's step times out with distributed_error.
//   case_agreement    check_agreement between processes: equal fingerprints pass; a value that
//                     differs on the last rank, a last rank that declares 500 entries more (bytes
//                     that would crash a collective of mismatched sizes) or two fewer, and, with 3
//                     ranks, differences on two ranks give every rank the same disagreement_error;
//                     the communicator still works afterwards.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <olmax/autodiff/autodiff.hpp>
#include <olmax/core/core.hpp>
#include <olmax/distributed/agreement.hpp>
#include <olmax/distributed/communicator.hpp>
#include <olmax/distributed/data_parallel.hpp>
#include <olmax/distributed/overlapped_allreduce.hpp>
#include <olmax/nn/linear.hpp>
#include <olmax/ops/ops.hpp>
#include <olmax/optim/adam.hpp>
#include <olmax/optim/parameters_of.hpp>

namespace olmax_distributed_test {

namespace dist = olmax::distributed;
using olmax::Tensor;
using Clock = std::chrono::steady_clock;

struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <class... Parts>
void expect(bool condition, const Parts&... parts) {
    if (!condition) throw Failure(olmax::detail::concat(parts...));
}

template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

inline double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// Rank r's input for a test of n elements: varied magnitudes and signs, so that the order of the
/// additions shows in the rounding (rank order vs. any other order would differ somewhere).
template <olmax::Real T>
std::vector<T> input_of(int rank, std::size_t n, std::uint64_t salt) {
    olmax::Generator rng(1000003 * (salt + 1) + std::uint64_t(rank));
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(rng.normal() * std::exp2(std::floor(rng.uniform() * 20) - 10));
    return v;
}

template <olmax::Real T>
void check_allreduce(dist::Communicator& comm, std::size_t n, dist::Reduction op, std::uint64_t salt) {
    std::vector<std::vector<T>> all;
    for (int r = 0; r < comm.world_size(); ++r) all.push_back(input_of<T>(r, n, salt));
    std::vector<std::span<const T>> parts(all.begin(), all.end());
    std::vector<T> expected(n);
    dist::reduce_in_rank_order<T>(parts, std::span<T>(expected), op);

    std::vector<T> data = all[comm.rank()];
    comm.allreduce(std::span<T>(data), op);
    expect(same_bits<T>(data, expected), "allreduce ", to_string(op), " of ", n, " ", olmax::dtype_name<T>(),
           " differs from reduce_in_rank_order");
    if (n > 1 && comm.world_size() > 2) {
        // The left-to-right order matters (and is what we get): the sum in reverse rank order differs.
        std::vector<std::span<const T>> reversed(parts.rbegin(), parts.rend());
        std::vector<T> other(n);
        dist::reduce_in_rank_order<T>(reversed, std::span<T>(other), op);
        if (n > 1000) expect(!same_bits<T>(other, expected), "the test inputs do not distinguish summation orders");
    }
}

inline void case_collectives(dist::Communicator& comm) {
    const auto start = Clock::now();
    std::uint64_t salt = 0;
    const std::size_t large = (std::size_t(1) << 22) + 3;  // ~4M elements, odd
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(7), std::size_t(1001), large})
        for (auto op : {dist::Reduction::sum, dist::Reduction::mean}) {
            check_allreduce<float>(comm, n, op, ++salt);
            if (n != large) check_allreduce<double>(comm, n, op, ++salt);
        }
    check_allreduce<double>(comm, large / 2, dist::Reduction::mean, ++salt);
    std::printf("allreduce: sizes 0..%zu, float and double, sum and mean, equal to reduce_in_rank_order (%.2f s)\n", large,
                seconds_since(start));

    // Tensor overload, in place.
    auto t = Tensor<float>::from({2, 3}, std::vector<float>{1, 2, 3, 4, 5, float(comm.rank())});
    comm.allreduce(t, dist::Reduction::sum);
    const int N = comm.world_size();
    expect(t(0, 0) == float(N) && t(1, 2) == float(N * (N - 1) / 2), "allreduce of a tensor: wrong values");

    // Broadcast from every root, of bytes and of doubles, sizes 0, 1, odd, large.
    for (int root = 0; root < N; ++root)
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(999), std::size_t(1) << 20}) {
            const auto source = input_of<double>(root, n, 77);
            auto data = comm.rank() == root ? source : std::vector<double>(n, -1.0);
            comm.broadcast(std::span<double>(data), root);
            expect(same_bits<double>(data, source), "broadcast of ", n, " doubles from rank ", root, ": wrong values");
        }
    std::printf("broadcast: from every root, 0 to 1M doubles\n");
    comm.barrier();

    bool refused = false;
    try {
        comm.broadcast(std::span<double>(), N);
    } catch (const olmax::value_error&) {
        refused = true;
    }
    expect(refused, "broadcast from a root outside the world was not refused");

    // Buckets: consecutive, bounded, a too-large tensor alone.
    const std::vector<std::size_t> sizes{10, 10, 10, 100, 1, 1};
    const auto buckets = dist::plan_buckets(sizes, 4, 80);
    const std::vector<std::pair<std::size_t, std::size_t>> want{{0, 2}, {2, 3}, {3, 4}, {4, 6}};
    expect(buckets == want, "plan_buckets: unexpected buckets");

    // Gradients some ranks lack: `some` has one on rank 0 only (the others add zeros), `none` on no
    // rank (it must stay without one, as in one process), `all` everywhere. With the flags folded into
    // the first bucket, every bucket size must give the same answer.
    for (std::size_t bucket_bytes : {std::size_t(4), std::size_t(25) << 20}) {
        auto some = olmax::parameter(Tensor<float>::from({3}, std::vector<float>{0, 0, 0}));
        auto none = olmax::parameter(Tensor<float>::from({2}, std::vector<float>{0, 0}));
        auto all = olmax::parameter(Tensor<float>::from({2}, std::vector<float>{0, 0}));
        if (comm.rank() == 0) olmax::sum(some * Tensor<float>::from({3}, std::vector<float>{2, 4, 6})).backward();
        olmax::sum(all * Tensor<float>::from({2}, std::vector<float>{float(comm.rank()), 1})).backward();
        dist::allreduce_gradients<float>(comm, std::vector<Tensor<float>>{some, none, all}, dist::Reduction::sum, {bucket_bytes, {}});
        expect(some.grad().defined() && some.grad()(0) == 2.0f && some.grad()(2) == 6.0f, "allreduce_gradients (buckets of ", bucket_bytes,
               " B): a gradient only rank 0 had is wrong");
        expect(!none.grad().defined(), "allreduce_gradients (buckets of ", bucket_bytes, " B): a parameter no rank had a gradient for got one");
        expect(all.grad()(0) == float(N * (N - 1) / 2) && all.grad()(1) == float(N), "allreduce_gradients (buckets of ", bucket_bytes,
               " B): wrong sum");
    }
    std::printf("allreduce_gradients: gradients on some, none and all ranks, flags in the first bucket\n");

    dist::LocalCommunicator local;
    std::vector<float> x{1.5f, -2.0f, 3.25f};
    const auto copy = x;
    local.allreduce(std::span<float>(x), dist::Reduction::mean);
    local.broadcast(std::span<float>(x), 0);
    local.barrier();
    expect(same_bits<float>(x, copy) && local.world_size() == 1 && local.rank() == 0, "LocalCommunicator changed its input");
}

// ---- train: a tiny MLP, 2 ranks vs. one process ------------------------------------------------

template <olmax::Real T>
struct Mlp {
    using value_type = T;
    olmax::nn::Linear<T> hidden, out;
    explicit Mlp(olmax::Generator& rng) : hidden(8, 16, rng, true), out(16, 4, rng, true) {}
    void visit_parameters(olmax::nn::ParameterVisitor<T>& visit) {
        visit.child("hidden", hidden);
        visit.child("out", out);
    }
    std::vector<olmax::optim::Parameter<T>> optimizer_parameters() { return olmax::optim::parameters_of(*this); }
    std::vector<Tensor<T>> tensors() { return dist::tensors_of(optimizer_parameters()); }  // hidden W, b, out W, b
    Tensor<T> loss(const Tensor<T>& x, const Tensor<T>& y) const {
        return olmax::mean(olmax::square(out.forward(olmax::tanh(hidden.forward(x))) - y));
    }
};

constexpr std::size_t shard_rows = 6;
constexpr int train_steps = 5;

inline olmax::optim::AdamWConfig adamw_config() {
    olmax::optim::AdamWConfig c;
    c.schedule.peak_lr = 0.05;
    c.weight_decay = 0.1;
    return c;
}

/// Shard `s` of step `step`'s global batch (the same numbers on every rank).
template <olmax::Real T>
std::pair<Tensor<T>, Tensor<T>> shard(int step, int s, int shards) {
    olmax::Generator rng(4242 + std::uint64_t(step));
    auto x = olmax::randn<T>({shard_rows * std::size_t(shards), 8}, rng);
    auto y = olmax::randn<T>({shard_rows * std::size_t(shards), 4}, rng);
    const std::size_t b = shard_rows * std::size_t(s);
    return {olmax::slice(x, 0, b, b + shard_rows).detach().clone(), olmax::slice(y, 0, b, b + shard_rows).detach().clone()};
}

template <olmax::Real T>
std::vector<Tensor<T>> train_distributed(dist::Communicator& comm, std::size_t bucket_bytes) {
    olmax::Generator rng(comm.rank() == 0 ? 7 : 1000 + comm.rank());  // rank 0's initialisation must win
    Mlp<T> model(rng);
    auto tensors = model.tensors();
    dist::broadcast_parameters<T>(comm, tensors, 0, {bucket_bytes, {}});
    olmax::optim::AdamW<T> opt(model.optimizer_parameters(), adamw_config());
    const auto named = dist::tensors_of(opt.parameters());  // the same handles, in the same order
    for (std::size_t i = 0; i < tensors.size(); ++i)
        expect(named[i].data() == tensors[i].data(), "tensors_of: parameter ", i, " is not the optimiser's tensor");
    for (int step = 0; step < train_steps; ++step) {
        opt.zero_grad();
        auto [x, y] = shard<T>(step, comm.rank(), comm.world_size());
        model.loss(x, y).backward();
        dist::allreduce_gradients<T>(comm, tensors, dist::Reduction::mean, {bucket_bytes, {}});
        opt.step();
    }
    return tensors;
}

/// One process: every shard's gradient in turn, combined with reduce_in_rank_order.
template <olmax::Real T>
std::vector<Tensor<T>> train_single_process(int shards) {
    olmax::Generator rng(7);
    Mlp<T> model(rng);
    auto tensors = model.tensors();
    olmax::optim::AdamW<T> opt(model.optimizer_parameters(), adamw_config());
    for (int step = 0; step < train_steps; ++step) {
        std::vector<std::vector<Tensor<T>>> grads(tensors.size());
        for (int s = 0; s < shards; ++s) {
            opt.zero_grad();
            auto [x, y] = shard<T>(step, s, shards);
            model.loss(x, y).backward();
            for (std::size_t i = 0; i < tensors.size(); ++i) grads[i].push_back(tensors[i].grad().clone());
        }
        for (std::size_t i = 0; i < tensors.size(); ++i) dist::reduce_in_rank_order<T>(grads[i], tensors[i].grad(), dist::Reduction::mean);
        opt.step();
    }
    return tensors;
}

/// One process, shards on threads (autodiff::data_parallel_backward sums them in shard order),
/// the sum then divided by the shard count. Equal to the above when every shard's gradient comes
/// out the same on a worker thread (ops run serially there) as on the main thread; reported, not
/// required.
template <olmax::Real T>
std::vector<Tensor<T>> train_thread_shards(int shards) {
    olmax::Generator rng(7);
    Mlp<T> model(rng);
    auto tensors = model.tensors();
    olmax::optim::AdamW<T> opt(model.optimizer_parameters(), adamw_config());
    for (int step = 0; step < train_steps; ++step) {
        opt.zero_grad();
        olmax::autodiff::data_parallel_backward<T>(tensors, std::size_t(shards), [&](std::size_t s) {
            auto [x, y] = shard<T>(step, int(s), shards);
            return model.loss(x, y);
        });
        for (auto& t : tensors)
            for (auto& g : t.grad().span()) g /= T(shards);
        opt.step();
    }
    return tensors;
}

template <olmax::Real T>
void check_training(dist::Communicator& comm) {
    const auto reference = train_single_process<T>(comm.world_size());
    const auto threads = train_thread_shards<T>(comm.world_size());
    bool same_as_threads = true;
    for (std::size_t i = 0; i < reference.size(); ++i) same_as_threads = same_as_threads && same_bits<T>(threads[i].span(), reference[i].span());
    for (std::size_t bucket_bytes : {std::size_t(100), std::size_t(25) << 20}) {
        const auto trained = train_distributed<T>(comm, bucket_bytes);
        for (std::size_t i = 0; i < trained.size(); ++i)
            expect(same_bits<T>(trained[i].span(), reference[i].span()), "training (", olmax::dtype_name<T>(), ", buckets of ", bucket_bytes,
                   " bytes): parameter ", i, " differs from the single-process reference");
        // Training moved the parameters away from the initialisation.
        olmax::Generator rng(7);
        Mlp<T> init(rng);
        expect(!same_bits<T>(init.tensors()[0].span(), trained[0].span()), "training did not change the parameters");
    }
    std::printf("training (%s): %d ranks x %zu rows, %d AdamW steps, bit-identical to one process averaging %d shard gradients"
                " (data_parallel_backward over %d thread shards: %s)\n",
                std::string(olmax::dtype_name<T>()).c_str(), comm.world_size(), shard_rows, train_steps, comm.world_size(), comm.world_size(),
                same_as_threads ? "bit-identical too" : "differs in rounding");
}

inline void case_train(dist::Communicator& comm) {
    check_training<float>(comm);
    check_training<double>(comm);
}

// ---- overlap: OverlappedAllreduce equals allreduce_gradients ----------------------------------------

/// The MLP plus a parameter that one rank per step gives a gradient (`some`) and one that no rank
/// does (`none`), listed first: the gradients become final in another order than the reverse of
/// the list (the reducer's first plan), so the plan it learns after step 1 differs.
template <olmax::Real T>
struct Partial {
    Mlp<T> mlp;
    Tensor<T> some, none;
    explicit Partial(olmax::Generator& rng)
        : mlp(rng), some(olmax::parameter(olmax::randn<T>({4}, rng))), none(olmax::parameter(olmax::randn<T>({3}, rng))) {}
    std::vector<Tensor<T>> tensors() {
        std::vector<Tensor<T>> t{some, none};
        for (const auto& p : mlp.tensors()) t.push_back(p);
        return t;
    }
    Tensor<T> loss(const Tensor<T>& x, const Tensor<T>& y, bool with_some) const {
        const auto l = mlp.loss(x, y);
        return with_some ? l + olmax::sum(some * some) * T(0.1) : l;
    }
};

/// Every step's gradients (clones; undefined where none) after the exchange, then the parameters.
template <olmax::Real T>
std::vector<std::vector<Tensor<T>>> train_partial(dist::Communicator& comm, std::size_t bucket_bytes, bool overlap, std::size_t shards) {
    olmax::Generator rng(7);  // the same on every rank
    Partial<T> model(rng);
    auto tensors = model.tensors();
    const dist::BucketOptions buckets{bucket_bytes, {}};
    std::optional<dist::OverlappedAllreduce<T>> reducer;
    if (overlap) reducer.emplace(comm, tensors, dist::Reduction::mean, dist::OverlapOptions{buckets});
    const int ranks = comm.world_size(), rank = comm.rank();
    std::vector<std::vector<Tensor<T>>> out;
    for (int step = 0; step < train_steps; ++step) {
        for (auto t : tensors) t.zero_grad();
        const bool with_some = rank == step % ranks;
        auto backward = [&] {
            if (shards == 1) {
                auto [x, y] = shard<T>(step, rank, ranks);
                model.loss(x, y, with_some).backward();
                return;
            }
            olmax::autodiff::data_parallel_backward<T>(tensors, shards, [&](std::size_t s) {
                auto [x, y] = shard<T>(step, rank * int(shards) + int(s), ranks * int(shards));
                return model.loss(x, y, with_some && s + 1 == shards);  // a private shard gradient
            });
        };
        if (reducer) {
            reducer->overlap(backward);
            expect(reducer->reported_during_backward() == tensors.size(), "overlap: ", reducer->reported_during_backward(), " of ",
                   tensors.size(), " gradients were reported final during backward");
        } else {
            backward();
            dist::allreduce_gradients<T>(comm, tensors, dist::Reduction::mean, buckets);
        }
        std::vector<Tensor<T>> grads;
        for (auto t : tensors) {
            grads.push_back(t.grad().defined() ? t.grad().clone() : Tensor<T>());
            if (t.grad().defined())
                for (std::size_t k = 0; k < t.size(); ++k) t.data()[k] -= T(0.05) * t.grad().data()[k];
        }
        out.push_back(std::move(grads));
        if (reducer && step == 0 && bucket_bytes == 1 && shards == 1) {
            // Rank 0 (which uses `some` in step 0) saw: none, some, then the layers from the output down.
            const std::vector<std::size_t> learned{1, 0, 5, 4, 3, 2};
            expect(reducer->order() == learned, "overlap: the bucket order after step 1 is not rank 0's order of final gradients");
            if (rank == 0)
                std::printf("overlap (%s): %zu buckets of 1 byte; %zu reduced during the backward of step 1; order learned then: 1 0 5 4 3 2\n",
                            std::string(olmax::dtype_name<T>()).c_str(), reducer->buckets().size(), reducer->reduced_during_backward());
        }
    }
    out.push_back(tensors);
    return out;
}

template <olmax::Real T>
void check_overlap(dist::Communicator& comm) {
    for (std::size_t shards : {std::size_t(1), std::size_t(2)})
        for (std::size_t bucket_bytes : {std::size_t(1), std::size_t(100), std::size_t(25) << 20}) {
            const auto plain = train_partial<T>(comm, bucket_bytes, false, shards);
            const auto overlapped = train_partial<T>(comm, bucket_bytes, true, shards);
            const std::string what = olmax::detail::concat("overlap (", olmax::dtype_name<T>(), ", buckets of ", bucket_bytes, " bytes, ", shards,
                                                           " shard(s) per rank)");
            for (std::size_t step = 0; step < plain.size(); ++step)
                for (std::size_t i = 0; i < plain[step].size(); ++i) {
                    const auto& a = plain[step][i];
                    const auto& b = overlapped[step][i];
                    expect(a.defined() == b.defined(), what, ": step ", step, " parameter ", i, " has a gradient in one path only");
                    expect(!a.defined() || same_bits<T>(a.span(), b.span()), what, ": step ", step, " parameter ", i,
                           " differs from backward + allreduce_gradients");
                }
            const std::size_t some = 0, none = 1;
            for (std::size_t step = 0; step + 1 < plain.size(); ++step) {
                expect(overlapped[step][some].defined(), what, ": the parameter one rank used has no gradient at step ", step);
                expect(!overlapped[step][none].defined(), what, ": the parameter no rank used has a gradient at step ", step);
            }
        }
    std::printf("overlap (%s): %d ranks, 5 steps, buckets of 1 B / 100 B / 25 MiB, 1 and 2 thread shards per rank: "
                "bit-identical to backward + allreduce_gradients, flags included\n",
                std::string(olmax::dtype_name<T>()).c_str(), comm.world_size());
}

/// The partial model's loss on rank `rank`'s shard, whose backward runs `midway` between the layers
/// (after the output layer's gradients are final, before the hidden layer's).
inline Tensor<float> midway_loss(const Partial<float>& model, int rank, const std::function<void()>& midway) {
    auto [x, y] = shard<float>(0, rank, 3);
    auto h = olmax::tanh(model.mlp.hidden.forward(x));
    h = olmax::autodiff::custom_op<float>("midway", h, {h}, [midway](const Tensor<float>& dh, olmax::autodiff::GradientSink<float>& g) {
        midway();
        g.add(0, dh);
    });
    return olmax::mean(olmax::square(model.mlp.out.forward(h) - y));
}

/// One overlapped step of midway_loss (each gradient in a bucket of its own).
inline void overlap_step(dist::OverlappedAllreduce<float>& reducer, Partial<float>& model, const std::function<void()>& midway) {
    reducer.overlap([&] { midway_loss(model, 0, midway).backward(); });
}

/// The learned plan splits buckets where rank 0 saw a gap: a 30 ms pause between the output and
/// the hidden layer's gradients (split_gap 10 ms) puts them in different buckets, which one 25 MiB
/// bucket would otherwise hold together; the results stay those of allreduce_gradients. In the
/// next step the first bucket is reduced while backward still waits inside the pausing node.
inline void check_overlap_gap_split(dist::Communicator& comm) {
    olmax::Generator rng_a(7), rng_b(7);
    Partial<float> plain(rng_a), overlapped(rng_b);  // equal parameters, separate tensors
    auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
    dist::OverlappedAllreduce<float> reducer(comm, overlapped.tensors(), dist::Reduction::mean,
                                             dist::OverlapOptions{{}, std::chrono::milliseconds(10)});
    expect(reducer.buckets().size() == 1, "overlap: 6 small gradients and the flags should start in one 25 MiB bucket");
    for (int step = 0; step < 2; ++step) {
        for (auto t : plain.tensors()) t.zero_grad();
        for (auto t : overlapped.tensors()) t.zero_grad();
        midway_loss(plain, comm.rank(), pause).backward();
        dist::allreduce_gradients<float>(comm, plain.tensors());
        bool reduced_inside = false;
        auto wait_for_first_bucket = [&] {  // step 2: the output layer's bucket leaves during backward
            const auto deadline = Clock::now() + std::chrono::seconds(10);
            while (reducer.buckets_reduced() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            reduced_inside = reducer.buckets_reduced() > 0;
        };
        reducer.overlap([&] { midway_loss(overlapped, comm.rank(), step == 0 ? std::function<void()>(pause) : wait_for_first_bucket).backward(); });
        expect(step == 0 || (reduced_inside && reducer.reduced_during_backward() >= 1),
               "overlap: the first bucket was not reduced while backward was still running");
        const auto a = plain.tensors(), b = overlapped.tensors();
        for (std::size_t i = 0; i < a.size(); ++i) {
            expect(a[i].grad().defined() == b[i].grad().defined(), "overlap with gap splits: parameter ", i, " has a gradient in one path only");
            expect(!a[i].grad().defined() || same_bits<float>(a[i].grad().span(), b[i].grad().span()), "overlap with gap splits: step ", step,
                   " parameter ", i, " differs from allreduce_gradients");
        }
    }
    std::vector<std::size_t> bucket_of(6);
    const auto buckets = reducer.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b)
        for (std::size_t k = buckets[b].first; k < buckets[b].second; ++k) bucket_of[reducer.order()[k]] = b;
    // parameters: 0 some, 1 none (unused here), 2 hidden W, 3 hidden b, 4 out W, 5 out b
    expect(bucket_of[4] != bucket_of[3] && bucket_of[5] != bucket_of[2], "overlap: the gap of 30 ms did not split the buckets (",
           buckets.size(), " buckets)");
    if (comm.rank() == 0)
        std::printf("overlap: a 30 ms gap in rank 0's backward split one 25 MiB bucket into %zu; the first is reduced while backward "
                    "still runs; results still bit-identical\n", buckets.size());
}

inline void case_overlap(dist::Communicator& comm) {
    const auto start = Clock::now();
    check_overlap<float>(comm);
    check_overlap<double>(comm);
    check_overlap_gap_split(comm);
    std::printf("rank %d: overlap checks took %.2f s\n", comm.rank(), seconds_since(start));
}

// ---- faults --------------------------------------------------------------------------------------

/// Runs `body`, which must throw distributed_error naming `operation` and this rank within
/// `limit_s` seconds; then checks that the communicator refuses further work.
inline void expect_failure(dist::Communicator& comm, std::string_view operation, double limit_s, const std::function<void()>& body) {
    const auto start = Clock::now();
    std::string message;
    try {
        body();
    } catch (const dist::distributed_error& e) {
        message = e.what();
    }
    const double took = seconds_since(start);
    expect(!message.empty(), operation, " did not fail although a peer was gone (", took, " s)");
    std::printf("rank %d: %s failed after %.2f s: %s\n", comm.rank(), std::string(operation).c_str(), took, message.c_str());
    expect(took < limit_s, operation, " took ", took, " s to fail, more than ", limit_s, " s");
    expect(message.find(operation) != std::string::npos, "the error does not name the operation: ", message);
    expect(message.find(olmax::detail::concat("rank ", comm.rank())) != std::string::npos, "the error does not name the rank: ", message);
    std::vector<float> more(4);
    bool refused = false;
    try {
        comm.allreduce(std::span<float>(more));
    } catch (const dist::distributed_error& e) {
        refused = std::string_view(e.what()).find("unusable") != std::string_view::npos;
    }
    expect(refused, "a broken communicator accepted another collective");
}

inline dist::Fingerprint agreement_base() {
    dist::Fingerprint f;
    f.add("--block", "conv_mixer").add("--features", std::int64_t(64)).add("--lr", 3e-3).add("parameter head.w", "float32 [64, 257]");
    return f;
}

/// check_agreement(comm, mine) must throw disagreement_error with exactly `expected` on this rank.
inline void expect_disagreement(dist::Communicator& comm, const dist::Fingerprint& mine, const std::string& expected) {
    const auto start = Clock::now();
    std::string message;
    try {
        dist::check_agreement(comm, mine);
    } catch (const dist::disagreement_error& e) {
        message = e.what();
    }
    std::printf("rank %d: check_agreement failed after %.3f s: %s\n", comm.rank(), seconds_since(start), message.c_str());
    expect(message == expected, "rank ", comm.rank(), " expected the disagreement '", expected, "', got '", message, "'");
}

inline void case_agreement(dist::Communicator& comm) {
    const int last = comm.world_size() - 1, world = comm.world_size();
    const std::string of = olmax::detail::concat(" of ", world, " ranks ");
    const std::string tail = "from rank 0; every rank must run the same program with the same settings)";
    dist::check_agreement(comm, agreement_base());  // equal: returns on every rank

    dist::Fingerprint narrow;
    narrow.add("--block", "conv_mixer").add("--features", std::int64_t(32)).add("--lr", 3e-3).add("parameter head.w", "float32 [32, 257]");
    expect_disagreement(comm, comm.rank() == last ? narrow : agreement_base(),
                        olmax::detail::concat("ranks disagree on '--features': rank 0 has 64, rank ", last, " has 32 (1", of, "differs ", tail));

    dist::Fingerprint longer = agreement_base();
    for (int i = 0; i < 500; ++i) longer.add(olmax::detail::concat("parameter layer", i, ".w"), "float32 [64, 64]");
    expect_disagreement(comm, comm.rank() == last ? longer : agreement_base(),
                        olmax::detail::concat("ranks disagree on 'parameter layer0.w': rank ", last,
                                              " has float32 [64, 64], rank 0 has no such entry (it declares 4 entries, rank ", last, " 504) (1",
                                              of, "differs ", tail));

    dist::Fingerprint shorter;  // the last rank lacks the entry: it sends an empty one
    shorter.add("--block", "conv_mixer").add("--features", std::int64_t(64));
    expect_disagreement(comm, comm.rank() == last ? shorter : agreement_base(),
                        olmax::detail::concat("ranks disagree on '--lr': rank 0 has 0.003, rank ", last,
                                              " has no such entry (it declares 2 entries, rank 0 4) (1", of, "differs ", tail));

    if (world >= 3) {  // rank 1 differs late, rank 2 early: the earlier entry is named, at rank 2
        dist::Fingerprint mine = agreement_base();
        if (comm.rank() == 1) mine.add("--steps", std::int64_t(10));
        if (comm.rank() == 2) {
            mine = dist::Fingerprint();
            mine.add("--block", "qrnn").add("--features", std::int64_t(64)).add("--lr", 3e-3).add("parameter head.w", "float32 [64, 257]");
        }
        expect_disagreement(comm, mine, olmax::detail::concat("ranks disagree on '--block': rank 0 has conv_mixer, rank 2 has qrnn (2", of, "differ ", tail));
    }

    // A disagreement is not a transport failure: the communicator goes on.
    std::vector<double> ones(3, 1.0);
    comm.allreduce(std::span<double>(ones));
    expect(ones[0] == double(world) && ones[2] == double(world), "the allreduce after the disagreements gave ", ones[0]);
    std::printf("rank %d: agreement checks passed\n", comm.rank());
}

inline void case_peer_exit(dist::Communicator& comm) {
    comm.barrier();
    if (comm.rank() == 1) std::_Exit(0);  // dies without any clean-up, as a crash would
    std::vector<float> data(1 << 16, 1.0f);
    const double limit = std::chrono::duration<double>(comm.default_timeout()).count() + 3;
    expect_failure(comm, "allreduce", limit, [&] { comm.allreduce(std::span<float>(data)); });
}

inline void case_overlap_peer_exit(dist::Communicator& comm) {
    olmax::Generator rng(7);
    Partial<float> model(rng);
    dist::OverlappedAllreduce<float> reducer(comm, model.tensors(), dist::Reduction::mean, dist::OverlapOptions{{1, {}}});
    overlap_step(reducer, model, [] {});  // a good step first
    comm.barrier();
    const double limit = std::chrono::duration<double>(comm.default_timeout()).count() + 3;
    expect_failure(comm, "allreduce", limit, [&] {
        overlap_step(reducer, model, [&] {
            if (comm.rank() == 1) std::_Exit(0);  // dies with buckets in flight, no clean-up
        });
    });
    bool refused = false;
    try {
        overlap_step(reducer, model, [] {});
    } catch (const dist::distributed_error& e) {
        refused = std::string_view(e.what()).find("unusable") != std::string_view::npos;
    }
    expect(refused, "the reducer accepted a step after a failed one");
}

inline void case_overlap_abandon(dist::Communicator& comm) {
    olmax::Generator rng(7);
    Partial<float> model(rng);
    dist::OverlappedAllreduce<float> reducer(comm, model.tensors(), dist::Reduction::mean, dist::OverlapOptions{{1, {}}});
    overlap_step(reducer, model, [] {});
    comm.barrier();
    const auto timeout = comm.default_timeout();
    const double timeout_s = std::chrono::duration<double>(timeout).count();
    if (comm.rank() == 1) {
        std::string message;
        try {
            overlap_step(reducer, model, [] { throw std::runtime_error("backward failed on purpose"); });
        } catch (const std::runtime_error& e) {
            message = e.what();
        }
        expect(message == "backward failed on purpose", "the backward's own exception did not pass through overlap(): '", message, "'");
        bool refused = false;
        try {
            overlap_step(reducer, model, [] {});
        } catch (const dist::distributed_error& e) {
            refused = std::string_view(e.what()).find("abandoned") != std::string_view::npos;
        }
        expect(refused, "the reducer accepted a step after an abandoned one");
        std::this_thread::sleep_for(timeout + std::chrono::seconds(1));  // stay alive: rank 0 must time out, not see an exit
        return;
    }
    const auto start = Clock::now();
    expect_failure(comm, "allreduce", timeout_s + 3, [&] { overlap_step(reducer, model, [] {}); });
    expect(seconds_since(start) >= timeout_s * 0.9, "the overlapped step failed before its timeout although the peer was alive");
}

inline void case_peer_hang(dist::Communicator& comm) {
    comm.barrier();
    const double timeout_s = std::chrono::duration<double>(comm.default_timeout()).count();
    std::vector<float> data(1 << 16, 1.0f);
    if (comm.rank() == 1) {
        std::this_thread::sleep_for(comm.default_timeout() + std::chrono::seconds(2));  // a hung rank
        bool failed = false;
        try {
            comm.allreduce(std::span<float>(data));
        } catch (const dist::distributed_error& e) {
            failed = true;
            std::printf("rank 1 (woke up): %s\n", e.what());
        }
        expect(failed, "the hung rank's late allreduce succeeded although rank 0 gave up");
        return;
    }
    const auto start = Clock::now();
    expect_failure(comm, "allreduce", timeout_s + 3, [&] { comm.allreduce(std::span<float>(data)); });
    expect(seconds_since(start) >= timeout_s * 0.9, "allreduce failed before its timeout although the peer was only slow");
}

}  // namespace olmax_distributed_test
