#!/usr/bin/env bash
# The main job on the whole-step XLA path: train_lm --device=xla on a real PJRT plugin against
# train_lm --device=cpu, over 200 steps of the default model, and checkpoints resumed across the two.
#   tests/xla/train_lm_xla.sh <train_lm> <PJRT plugin .so> <work folder>
#
# Tolerances (the fp32 sums of XLA's fused kernels and of olmax's GEMMs are ordered differently, and
# training amplifies rounding differences step by step; the same run on 1 and 2 CPU threads, whose
# sums also differ in order, is measured beside it for scale):
#   steps 1-5: training loss within 1e-6 relative: rounding only (measured at most 1.7e-7, one unit in
#     the last of the 7 printed digits, on AMD EPYC with AVX2 and with AVX-512)
#   steps 1-10: within 3e-5 relative (measured 1.8e-7 with AVX2; 6.9e-6 with AVX-512, where XLA's
#     kernels sum in another order and AdamW's m / sqrt(v) on near-zero gradients amplifies it from
#     step 8 on; 1 vs 2 CPU threads 2.0e-7)
#   steps 1-200: on average within 5e-3 relative and at every step within 2e-2 (rounding differences
#     grow chaotically over 200 steps, so one step's batch can spike: measured mean 4.4e-4 and
#     5.1e-4, worst 3.9e-3 against the CPU and 9.5e-3 at one step for SPMD over 2 devices against
#     1; CPU 1 vs 2 threads 3.0e-3 to 4.5e-3 worst)
#   held-out loss at step 200: within 0.01 nats/byte (measured 0.001 and 0.002)
# (Those figures are from CPU runs that rebuilt every block and kept AdamW's moments in double. Since
# train_lm keeps blocks' activations where memory allows and float moments by default, measured on
# a 2-vCPU Intel Xeon with AVX-512, 2026-11-26: steps 1-5 1.7e-7, 1-10 7.0e-6, 1-200 mean 5.2e-4 and
# worst 6.0e-3, held-out 2.3e-3; CPU 1 vs 2 threads 4.0e-7 over 200 steps.)
# The same limits hold for XLA's SPMD data parallelism over 2 devices against 1 device, and steps 1-5's
# for --block=mamba (measured 1.6e-7 with AVX-512); --block=moe (routing and capacity on the device,
# the balance loss's gradient from inside the layer loop) within 3e-6 (measured 7.0e-7 with AVX-512:
# the router's softmax adds its own rounding); and within 3e-6 for --block=qrnn with
# --xla_scan_form=hillis_steele_chunked and --block=mamba with --xla_scan_form=hillis_steele (GPUs' form), both
# summing the scan in another order than the CPU's loop (measured 1.8e-7, and 0 in the printed digits,
# on AMD EPYC Zen 5 with AVX-512, 2026-11-27).
set -euo pipefail
train_lm=$1 plugin=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
export OLMAX_PJRT_PLUGIN=  # the flag names the plugin; the missing-plugin case below relies on this

run() {  # run <folder> <flags...>: train_lm with the shared flags into <work>/<folder>
  local dir=$1
  shift
  if ! "$train_lm" --eval_every=100 --checkpoint_every=100 --plot=false --sample_bytes=0 --checkpoint_dir="$work/$dir" "$@" \
      > "$work/$dir.log" 2>&1; then
    cat "$work/$dir.log"
    echo "FAIL: train_lm $* exited with an error"
    exit 1
  fi
}
xla=(--device=xla --xla_plugin="$plugin")

run cpu --steps=200 --threads=2
run cpu_1_thread --steps=200 --threads=1
run xla --steps=200 "${xla[@]}"
run xla_2_devices --steps=200 "${xla[@]}" --xla_devices=2
# Kept blocks on XLA (the forward loop stores what their backward reads; the default rebuilds them).
run xla_kept --steps=10 "${xla[@]}" --kept_layers=2
grep -q "the first 2 of 2 blocks keep their activations" "$work/xla_kept.log" || { cat "$work/xla_kept.log"; echo "FAIL: the XLA run kept no activations"; exit 1; }
run mamba_cpu --steps=5 --threads=2 --block=mamba
run mamba_xla --steps=5 "${xla[@]}" --block=mamba
run moe_cpu --steps=5 --threads=2 --block=moe
run moe_xla --steps=5 "${xla[@]}" --block=moe
# Scan forms other than the CPU's loop, through the flag: QRNN's pooling in hillis_steele_chunked, and Mamba as GPUs
# run it (doubling over the materialised [B, T, E N] states instead of the fused selective scan).
run qrnn_cpu --steps=5 --threads=2 --block=qrnn
run qrnn_xla_hillis_steele_chunked --steps=5 "${xla[@]}" --block=qrnn --xla_scan_form=hillis_steele_chunked
run mamba_xla_doubling --steps=5 "${xla[@]}" --block=mamba --xla_scan_form=hillis_steele
grep -q "step compiled in" "$work/xla.log" || { cat "$work/xla.log"; echo "FAIL: the XLA run did not report its compiled step"; exit 1; }

# Checkpoints are interchangeable: each run's step-200 checkpoint resumed on the other device.
for pair in "xla_then_cpu xla cpu" "cpu_then_xla cpu xla" "cpu_then_cpu cpu cpu"; do
  set -- $pair
  cp -r "$work/$2" "$work/$1"
  if [ "$3" = xla ]; then run "$1" --steps=300 "${xla[@]}"; else run "$1" --steps=300 --threads=2; fi
  grep -q "resumed from .*ckpt-0000000200.olmax at step 200" "$work/$1.log" || { cat "$work/$1.log"; echo "FAIL: $1 did not resume"; exit 1; }
done

/usr/bin/python3 - "$work" <<'EOF'
import csv, sys
work = sys.argv[1]

def losses(name):
    with open(f"{work}/{name}/metrics.csv") as f:
        return {(int(r["step"]), r["split"]): float(r["loss"]) for r in csv.DictReader(f)}

def mean(a, b, steps):
    return sum(abs(a[(s, "train")] - b[(s, "train")]) / a[(s, "train")] for s in steps) / len(steps)

def worst(a, b, steps):
    return max(abs(a[(s, "train")] - b[(s, "train")]) / a[(s, "train")] for s in steps)

cpu, cpu1, xla, xla2 = losses("cpu"), losses("cpu_1_thread"), losses("xla"), losses("xla_2_devices")
failures = []
def check(what, value, limit):
    print(f"{what}: {value:.2e} (limit {limit:.0e})")
    if not value <= limit:
        failures.append(what)

print(f"for scale, CPU 1 vs 2 threads: steps 1-10 {worst(cpu, cpu1, range(1, 11)):.2e}, steps 1-200 {worst(cpu, cpu1, range(1, 201)):.2e}")
check("xla vs cpu, training loss, steps 1-5", worst(cpu, xla, range(1, 6)), 1e-6)
check("xla vs cpu, training loss, steps 1-10", worst(cpu, xla, range(1, 11)), 3e-5)
check("xla vs cpu, training loss, steps 1-200, mean", mean(cpu, xla, range(1, 201)), 5e-3)
check("xla vs cpu, training loss, steps 1-200, worst step", worst(cpu, xla, range(1, 201)), 2e-2)
check("xla vs cpu, held-out loss at step 200 (nats/byte)", abs(cpu[(200, "eval")] - xla[(200, "eval")]), 1e-2)
check("xla keeping both blocks vs cpu, training loss, steps 1-5", worst(cpu, losses("xla_kept"), range(1, 6)), 1e-6)
check("xla keeping both blocks vs cpu, training loss, steps 1-10", worst(cpu, losses("xla_kept"), range(1, 11)), 3e-5)
check("xla SPMD over 2 devices vs 1, training loss, steps 1-5", worst(xla, xla2, range(1, 6)), 1e-6)
check("xla SPMD over 2 devices vs 1, training loss, steps 1-10", worst(xla, xla2, range(1, 11)), 3e-5)
check("xla SPMD over 2 devices vs 1, training loss, steps 1-200, mean", mean(xla, xla2, range(1, 201)), 5e-3)
check("xla SPMD over 2 devices vs 1, training loss, steps 1-200, worst step", worst(xla, xla2, range(1, 201)), 2e-2)
check("--block=mamba: xla vs cpu, training loss, steps 1-5", worst(losses("mamba_cpu"), losses("mamba_xla"), range(1, 6)), 1e-6)
check("--block=moe: xla vs cpu, training loss, steps 1-5", worst(losses("moe_cpu"), losses("moe_xla"), range(1, 6)), 3e-6)
check("--block=qrnn --xla_scan_form=hillis_steele_chunked: xla vs cpu, training loss, steps 1-5", worst(losses("qrnn_cpu"), losses("qrnn_xla_hillis_steele_chunked"), range(1, 6)), 3e-6)
check("--block=mamba --xla_scan_form=hillis_steele: xla vs cpu, training loss, steps 1-5",
      worst(losses("mamba_cpu"), losses("mamba_xla_doubling"), range(1, 6)), 3e-6)
reference = losses("cpu_then_cpu")
for name in ("xla_then_cpu", "cpu_then_xla"):
    resumed = losses(name)
    check(f"{name} vs cpu_then_cpu, training loss, steps 201-300", worst(reference, resumed, range(201, 301)), 1e-2)
    check(f"{name} vs cpu_then_cpu, held-out loss at step 300", abs(reference[(300, "eval")] - resumed[(300, "eval")]), 1e-2)
if failures:
    sys.exit("FAIL: " + "; ".join(failures))
EOF

# Bad settings are clear errors before any training.
expect_error() {  # expect_error <message part> <flags...>
  local want=$1
  shift
  if "$train_lm" --steps=5 --plot=false --sample_bytes=0 --checkpoint_dir="$work/refused" "$@" > "$work/refused.log" 2>&1; then
    echo "FAIL: train_lm $* succeeded"
    exit 1
  fi
  grep -q -- "$want" "$work/refused.log" || { cat "$work/refused.log"; echo "FAIL: train_lm $* did not say '$want'"; exit 1; }
}
expect_error "needs a PJRT plugin" --device=xla
expect_error "does not exist" --device=xla --xla_plugin="$work/no_such_plugin.so"
expect_error "grad_accumulation=1" --device=xla --xla_plugin="$plugin" --grad_accumulation=2
expect_error "multiple of 'xla_devices'" --device=xla --xla_plugin="$plugin" --xla_devices=3
expect_error "expects one of auto, sequential" --device=xla --xla_plugin="$plugin" --xla_scan_form=parallel
expect_error "adam_moments=bf16 is for --device=cpu" --device=xla --xla_plugin="$plugin" --adam_moments=bf16
echo "train_lm --device=xla: all checks passed"
