# The blocks and model shapes the XLA step benchmarks measure unless BLOCKS and SHAPES say otherwise
# (sourced by step_time.sh, gpu_figures.sh and run.sh, so that their defaults cannot drift apart).
# Shapes are "features:depth:batch:sequence": the main job's and the small preset.
default_blocks="conv_mixer qrnn mamba moe"
default_shapes="64:2:8:64 128:4:16:128"
