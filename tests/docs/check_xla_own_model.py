#!/usr/bin/env python3
"""docs/xla.md's "Your own model on XLA", done as a reader does it: examples/custom_layer_xla.cpp
copied to my_model.cpp, built with the documented compile line and run on the CPU plugin (it exits 1
when its CPU and XLA loss curves part); then the documented CMakeLists.txt and cmake commands, with
tests/docs/xla_cmake_probe.cpp as my_model.cpp (a small olmax::pjrt program that adds two vectors on
the plugin: the block is what is checked there, and compiling the example a second time would cost
CI a minute for nothing). The blocks are the ones after the `<!-- checked: xla-own-model ... -->`
comments, run as written; only the line `OLMAX=/path/to/olmax` is pointed at this checkout.

Usage: check_xla_own_model.py --root REPO --work DIR
"""

import argparse
import os
import re
import shutil
import subprocess
import sys


def marked_blocks(text):
    """{marker: (first line number, code)} for each fenced block right after a checked comment."""
    blocks, lines = {}, text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"<!-- checked: xla-own-model ([a-z-]+) -->", line.strip())
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        k = j + 1
        while k < len(lines) and not lines[k].startswith("```"):
            k += 1
        blocks[m.group(1)] = (j + 2, "\n".join(lines[j + 1:k]) + "\n")
    return blocks


def run_block(name, code, cwd, root):
    """Runs a sh block with bash -e; the OLMAX= line names this checkout."""
    lines = code.split("\n")
    if not any(l.startswith("OLMAX=") for l in lines):
        lines.insert(0, f"OLMAX={root}")
    lines = [f"OLMAX={root}" if l.startswith("OLMAX=") else l for l in lines]
    script = "set -euo pipefail\n" + "\n".join(lines)
    print(f"--- {name} (in {cwd}):\n{script}", flush=True)
    done = subprocess.run(["bash", "-c", script], cwd=cwd, timeout=900)
    if done.returncode != 0:
        sys.exit(f"FAIL: docs/xla.md's {name} block exited with {done.returncode}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    root, work = os.path.abspath(args.root), os.path.abspath(args.work)
    with open(os.path.join(root, "docs", "xla.md"), encoding="utf-8") as f:
        blocks = marked_blocks(f.read())
    missing = {"compile", "cmake", "cmake-build"} - set(blocks)
    if missing:
        sys.exit(f"FAIL: docs/xla.md has no checked block(s) {sorted(missing)} (<!-- checked: xla-own-model NAME --> before a fenced block)")
    compile_code = blocks["compile"][1]
    pjrt_line = next((l for l in compile_code.split("\n") if l.startswith("PJRT=")), None)
    if pjrt_line is None:
        sys.exit("FAIL: docs/xla.md's compile block does not set PJRT= (the cmake block uses it)")

    shutil.rmtree(work, ignore_errors=True)
    for sub, program in (("line", os.path.join("examples", "custom_layer_xla.cpp")),
                         ("cmake", os.path.join("tests", "docs", "xla_cmake_probe.cpp"))):
        os.makedirs(os.path.join(work, sub))
        shutil.copy(os.path.join(root, program), os.path.join(work, sub, "my_model.cpp"))
    run_block("compile", compile_code, os.path.join(work, "line"), root)
    with open(os.path.join(work, "cmake", "CMakeLists.txt"), "w", encoding="utf-8") as f:
        f.write(blocks["cmake"][1])
    # The cmake commands run in the same shell as the reader's: OLMAX and PJRT from the block above.
    run_block("cmake-build", f"OLMAX=\n{pjrt_line}\n" + blocks["cmake-build"][1], os.path.join(work, "cmake"), root)
    print("docs/xla.md own-model example: built and ran from the compile line; the CMake snippet built and ran an olmax::pjrt program")


if __name__ == "__main__":
    main()
