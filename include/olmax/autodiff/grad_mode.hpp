#pragma once
// Grad mode: whether ops on this thread record onto the tape at all (on by default).
//
// The flag is per thread, like the tape: a `no_grad` on one thread never stops another thread's
// recording. It is the only autodiff state that needs no tensor type, so it sits in its own header
// that the tape, the custom ops and code that only evaluates (sampling, optimiser updates) include.

namespace olmax::autodiff {

namespace detail {

/// This thread's grad-mode flag (true: ops record).
inline bool& grad_mode_flag() {
    thread_local bool enabled = true;
    return enabled;
}

}  // namespace detail

inline bool is_grad_enabled() { return detail::grad_mode_flag(); }

/// RAII: ops inside record nothing (evaluation, sampling, optimiser updates).
class no_grad {
public:
    no_grad() : previous_(detail::grad_mode_flag()) { detail::grad_mode_flag() = false; }
    ~no_grad() { detail::grad_mode_flag() = previous_; }
    no_grad(const no_grad&) = delete;
    no_grad& operator=(const no_grad&) = delete;

private:
    bool previous_;
};

/// RAII: turns recording back on, e.g. inside a custom backward that recomputes its forward.
class enable_grad {
public:
    enable_grad() : previous_(detail::grad_mode_flag()) { detail::grad_mode_flag() = true; }
    ~enable_grad() { detail::grad_mode_flag() = previous_; }
    enable_grad(const enable_grad&) = delete;
    enable_grad& operator=(const enable_grad&) = delete;

private:
    bool previous_;
};

}  // namespace olmax::autodiff
