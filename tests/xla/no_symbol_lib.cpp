// A shared library without GetPjrtApi: loading it as a PJRT plugin must fail cleanly.
extern "C" __attribute__((visibility("default"))) int olmax_not_a_pjrt_plugin() { return 42; }
