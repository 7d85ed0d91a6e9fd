#pragma once
// One-time notices of the bf16 paths ("bf16 GEMMs compute in fp32 ..."): each key is shown once
// per process, on stderr or to the sink that backend::set_bf16_notice_sink (bf16_gemm.hpp) sets.

#include <cstdio>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace olmax::backend::detail {

struct bf16_notice_state {
    std::mutex mutex;
    std::set<std::string, std::less<>> shown;
    std::function<void(std::string_view)> sink;
};
inline bf16_notice_state& bf16_notices() {
    static bf16_notice_state state;
    return state;
}

/// Shows `message` once per process per `key` (on stderr, or to the sink of set_bf16_notice_sink).
inline void bf16_notice(std::string_view key, const std::string& message) {
    std::function<void(std::string_view)> sink;
    {
        auto& state = bf16_notices();
        std::lock_guard<std::mutex> lock(state.mutex);
        if (!state.shown.emplace(key).second) return;
        sink = state.sink;
    }
    if (sink) sink(message);
    else std::fprintf(stderr, "%s; this notice is shown once\n", message.c_str());
}

}  // namespace olmax::backend::detail
