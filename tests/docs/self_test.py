#!/usr/bin/env python3
"""Self-test of the snippet check: runs extract_snippets.py on tests/docs/fixture and compiles and
runs what it generates, expecting each fixture page's fault to be caught the way the real check
catches it (and good.md to pass). Needs only a C++20 compiler, no olmax headers, so it takes seconds.

    self_test.py --compiler g++ --work DIR
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixture")
EXTRACT = os.path.join(HERE, "extract_snippets.py")


def extract(page, out):
    return subprocess.run([sys.executable, EXTRACT, "--root", FIXTURE, "--out", out, os.path.join(FIXTURE, page)],
                          capture_output=True, text=True)


def build_and_run(compiler, out, page):
    unit = os.path.join(out, page.replace(".", "_") + ".cpp")
    program = os.path.join(out, "program")
    built = subprocess.run([compiler, "-std=c++20", "-Werror=return-type", unit, os.path.join(out, "driver.cpp"), "-o", program],
                           capture_output=True, text=True)
    if built.returncode != 0:
        return "compile", built.stderr
    ran = subprocess.run([program], capture_output=True, text=True)
    return ("run" if ran.returncode != 0 else "ok"), ran.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    failures = []

    def expect(condition, what):
        print(("ok    " if condition else "FAIL  ") + what)
        if not condition:
            failures.append(what)

    # (page, expected stage, text the output must contain)
    cases = [
        ("good.md", "ok", "good.md: 2 C++ block(s) compiled, 1 run, 2 skipped"),
        ("stale.md", "compile", "stale.md:5"),  # the compiler error points at the markdown line
        ("failing.md", "run", "FAILED failing.md:4: main returned 3"),
        ("failing.md", "run", "FAILED failing.md:9: threw snippet threw"),
    ]
    for page, stage, text in cases:
        out = os.path.join(args.work, page.replace(".", "_"))
        extracted = extract(page, out)
        if extracted.returncode != 0:
            expect(False, f"{page}: extraction failed: {extracted.stdout.strip()}")
            continue
        got, output = build_and_run(args.compiler, out, page)
        expect(got == stage and text in output, f"{page}: {stage} stage, output contains '{text}' (got {got} stage)")
        if got != stage or text not in output:
            print(output)

    extracted = extract("untagged.md", os.path.join(args.work, "untagged"))
    expect(extracted.returncode == 1, "untagged.md: extraction fails")
    expect("untagged.md:3: this code block holds C++ but is not tagged" in extracted.stdout, "untagged.md: names the untagged block")
    expect("untagged.md:8: a snippet's main takes no arguments" in extracted.stdout, "untagged.md: refuses main with arguments")

    if failures:
        print(f"docs snippet self-test FAILED: {len(failures)} expectation(s) not met")
        return 1
    print("docs snippet self-test: every fixture fault was caught, and good.md passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
