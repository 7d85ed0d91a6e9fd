"""Runs olmax's emitted StableHLO modules on a real XLA (jax's CPU backend) and compares the outputs
with olmax's CPU reference. Test-only: nothing in the library depends on Python.

Usage: run_xla_oracle.py <folder written by xla_oracle_dump>

Each case in manifest.txt is one of
  match          the module must compile, run, and agree with the reference outputs;
  mismatch       a deliberately wrong module: it must compile and run, and the comparison must FAIL;
  compile_error  malformed text: XLA must reject it (its message is printed).
Exit status: 0 all cases behaved, 1 some did not, 77 jax is unusable (the CTest test is skipped).
"""

import os
import sys
import time

SKIP = 77
RTOL = 1e-5  # f32: |y - ref| <= RTOL * (|ref| + max|ref|) elementwise


def load_manifest(folder):
    cases, current = [], None
    with open(os.path.join(folder, "manifest.txt")) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "case":
                current = {"name": parts[1], "expect": parts[2], "inputs": [], "outputs": []}
                cases.append(current)
            else:
                dims = () if parts[2] == "-" else tuple(int(d) for d in parts[2].split(","))
                current["inputs" if parts[0] == "in" else "outputs"].append((parts[1], dims))
    return cases


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    folder = sys.argv[1]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import numpy as np
        import jax
        import jax.extend as jex
        from jax._src.lib import xla_client
    except Exception as e:  # noqa: BLE001 - any import failure means "no oracle here"
        print(f"SKIP: jax is not importable ({e!r}); run tools/setup_jax_venv.sh")
        return SKIP

    backend = jex.backend.get_backend("cpu")
    device = backend.devices()[0]
    print(f"jax {jax.__version__}, XLA CPU backend {backend.platform_version}")

    # olmax's own compile-options bytes (the ones its PJRT runtime sends) must parse as 1 replica x 1
    # partition, and every module below is compiled with them.
    with open(os.path.join(folder, "compile_options.bin"), "rb") as f:
        options_bytes = f.read()
    options = xla_client.CompileOptions.ParseFromString(options_bytes)
    build = options.executable_build_options
    if (build.num_replicas, build.num_partitions) != (1, 1):
        print(f"FAIL  compile options {options_bytes.hex()}: parse as replicas={build.num_replicas} "
              f"partitions={build.num_partitions}, expected 1 x 1")
        return 1
    print(f"ok    compile options {options_bytes.hex()}: 1 replica x 1 partition")

    def compile_module(text):
        return backend.compile_and_load(text, executable_devices=backend.devices()[:1], compile_options=options)

    # The portable-artifact path (VHLO bytecode, the only StableHLO form with a compatibility
    # guarantee): every matching module must serialize to the oldest StableHLO version this jaxlib
    # supports; a few are compiled and run from that bytecode too.
    try:
        import jaxlib.mlir.dialects.stablehlo as stablehlo_dialect
        vhlo_target = stablehlo_dialect.get_minimum_version()
    except Exception as e:  # noqa: BLE001 - moved between jax releases
        vhlo_target = None
        print(f"note  VHLO check skipped: {e!r}")
    bytecode_cases = ("scan_forward.chunked_matmul128.3x129", "scan_backward.chunked_matmul128.3x129",
                      "matmul_backward.33x70x129", "scan_forward.sequential.3x129")

    def run(executable, inputs):
        out = executable.execute_sharded([jax.device_put(x, device) for x in inputs])
        return [np.asarray(r[0]) for r in out.disassemble_into_single_device_arrays()]

    failures = 0
    for case in load_manifest(folder):
        name, expect = case["name"], case["expect"]
        with open(os.path.join(folder, name + ".mlir")) as f:
            text = f.read()
        read = lambda entry: np.fromfile(os.path.join(folder, entry[0]), dtype="<f4").reshape(entry[1])
        inputs = [read(e) for e in case["inputs"]]
        expected = [read(e) for e in case["outputs"]]
        start = time.perf_counter()
        try:
            executable = compile_module(text)
        except Exception as e:  # noqa: BLE001 - XLA raises its own error types
            message = str(e).strip().splitlines()
            if expect == "compile_error":
                print(f"ok    {name}: rejected by XLA as expected: {message[0] if message else e!r}")
            else:
                failures += 1
                print(f"FAIL  {name}: XLA rejected the module:\n      " + "\n      ".join(message[:20]))
            continue
        if expect == "compile_error":
            failures += 1
            print(f"FAIL  {name}: malformed module was accepted by XLA")
            continue
        try:
            outputs = run(executable, inputs)
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL  {name}: execution failed: {e}")
            continue
        seconds = time.perf_counter() - start
        worst, problems = 0.0, []
        if len(outputs) != len(expected):
            problems.append(f"{len(outputs)} outputs, expected {len(expected)}")
        for i, (got, ref) in enumerate(zip(outputs, expected)):
            if got.shape != ref.shape:
                problems.append(f"output {i}: shape {got.shape}, expected {ref.shape}")
                continue
            ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
            scale = np.abs(ref64) + (np.abs(ref64).max() if ref64.size else 0.0)
            error = np.abs(got64 - ref64)
            ratio = float((error / np.maximum(scale, 1e-30)).max()) if ref.size else 0.0
            worst = max(worst, ratio)
            if not np.all(np.isfinite(got64)) or not np.all(error <= RTOL * scale):
                problems.append(f"output {i}: max |err| {error.max():.3e}, max |err|/scale {ratio:.3e} > {RTOL:g}")
        if vhlo_target is not None and expect == "match":
            try:
                artifact = jex.mlir.serialize_portable_artifact(text, vhlo_target)
                if name in bytecode_cases:
                    from_bytecode = run(compile_module(artifact), inputs)
                    if any(not np.array_equal(a, b) for a, b in zip(from_bytecode, outputs)):
                        problems.append(f"VHLO {vhlo_target} bytecode gives different results than the text")
            except Exception as e:  # noqa: BLE001
                problems.append(f"VHLO serialization to StableHLO {vhlo_target} failed: {e}")
        if expect == "mismatch":
            if problems:
                print(f"ok    {name}: wrong module detected ({problems[0]})")
            else:
                failures += 1
                print(f"FAIL  {name}: deliberately wrong module was NOT detected (max rel err {worst:.3e})")
        elif problems:
            failures += 1
            print(f"FAIL  {name}: " + "; ".join(problems))
        else:
            print(f"ok    {name}: max |err|/scale {worst:.2e} ({seconds * 1e3:.0f} ms compile+run)")
    if vhlo_target is not None:
        print(f"note  every matching module also serialized to VHLO for StableHLO {vhlo_target}; "
              f"{len(bytecode_cases)} compiled and run from that bytecode")
    print("all cases behaved" if failures == 0 else f"{failures} case(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
