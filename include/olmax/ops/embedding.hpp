#pragma once
// Embedding lookup: a gather of table rows whose backward is a scatter-add into the table.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "olmax/autodiff/tape.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/ops/op_keys.hpp"

namespace olmax {

/// Rows of `table` ([V, F]) picked by `ids` (any shape, values in [0, V)): the result has shape
/// ids.shape + [F]. Backward adds each output row's gradient into its table row (ids that repeat
/// accumulate). An id outside [0, V) throws `value_error` naming the id and V.
template <Real T>
Tensor<T> embedding(const Tensor<T>& table, const Tensor<std::int32_t>& ids) {
    backend::op_scope on("embedding", table, ids);
    if (!(table.rank() == 2))
        throw shape_error(olmax::detail::concat("embedding: the table must have shape [V, F], got ", to_string(table.shape())));
    const std::size_t vocab = table.shape()[0], features = table.shape()[1];
    const std::size_t count = ids.size();
    return on.run<op::embedding>({table, ids}, {}, [&] {
        const std::int32_t* id = ids.data();
        for (std::size_t i = 0; i < count; ++i)
            if (id[i] < 0 || std::size_t(id[i]) >= vocab)
                throw value_error(olmax::detail::concat("embedding: id ", id[i], " at position ", i, " is out of range for a table of V=",
                                                        vocab, " rows (shape ", to_string(table.shape()), ")"));
        Shape out_shape = ids.shape();
        out_shape.push_back(features);
        auto y = Tensor<T>::uninitialized(out_shape);
        const T* tp = table.data();
        T* yp = y.data();
        backend::current().parallel_for(count, features, [&](std::size_t lo, std::size_t hi) {
            for (std::size_t i = lo; i < hi; ++i) std::copy_n(tp + std::size_t(id[i]) * features, features, yp + i * features);
        });
        autodiff::record<T>("embedding", std::span<const Tensor<T>>(&table, 1), std::span<Tensor<T>>(&y, 1),
                            [ids, table_shape = table.shape()](std::span<const Tensor<T>> g, autodiff::GradientSink<T>& sink) {
                                const std::size_t f = table_shape[1], n = ids.size();
                                Tensor<T> dtable(table_shape);
                                const std::int32_t* idp = ids.data();
                                const T* gp = g[0].data();
                                T* dp = dtable.data();
                                // Threads own disjoint feature columns, so repeated ids never race.
                                backend::current().parallel_for(f, n, [&](std::size_t lo, std::size_t hi) {
                                    for (std::size_t i = 0; i < n; ++i) {
                                        T* row = dp + std::size_t(idp[i]) * f;
                                        const T* grow = gp + i * f;
    #pragma omp simd
                                        for (std::size_t j = lo; j < hi; ++j) row[j] += grow[j];
                                    }
                                });
                                sink.add(0, std::move(dtable));
                            });
        return y;
    });
}

namespace op {

/// table [V, F] and ids (any shape; ids as values): ids.shape + [F].
struct embedding : registered<embedding> {
    static constexpr std::string_view name = "embedding";
    struct attrs {};
    static std::vector<sample<attrs>> samples(Generator& rng) {
        return {{{samples::uniform(rng, {6, 3}), samples::indices(rng, {2, 4}, 6)}, {}, {1}},
                {{samples::uniform(rng, {4, 5}), samples::indices(rng, {7}, 4)}, {}, {1}}};
    }
    template <Real T> static Tensor<T> eager(std::span<const Tensor<T>> in, const attrs&) {
        return olmax::embedding(in[0], backend::trace::as_indices(in[1]));
    }
};

}  // namespace op

}  // namespace olmax
