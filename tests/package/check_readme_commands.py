#!/usr/bin/env python3
"""The README's commands as a newcomer types them after the set-up: every `build/examples/<name>`
command in a ```sh block of README.md names a program that `bash tools/main.sh` builds (its
`ladder=(...)` list), and the Quickstart's command, run from the checkout exactly as written,
exits 0 and prints the falling loss.

Usage: check_readme_commands.py --root REPO --build BUILD_DIR
The command is run as written when BUILD_DIR is REPO/build (as after tools/main.sh and in CI);
from another build folder its program is run from there, so the check still runs what was built.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys


def sh_blocks(text):
    """(start line, lines) of each ```sh block."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.split("\n"), start=1):
        if current is None:
            if line.strip() == "```sh":
                current, start = [], number + 1
        elif line.strip().startswith("```"):
            blocks.append((start, current))
            current = None
        else:
            current.append(line)
    return blocks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--build", required=True)
    args = parser.parse_args()
    root, build = os.path.abspath(args.root), os.path.abspath(args.build)
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(root, "tools", "main.sh"), encoding="utf-8") as f:
        ladder = re.search(r"^ladder=\(([^)]*)\)", f.read(), re.M)
    if not ladder:
        sys.exit("FAIL: tools/main.sh has no ladder=(...) list of the programs it builds")
    built = set(ladder.group(1).split())

    errors = []
    for start, lines in sh_blocks(readme):
        for offset, line in enumerate(lines):
            for name in re.findall(r"(?:^|\s)build/examples/([A-Za-z0-9_]+)", line.split("#", 1)[0]):
                if name not in built:
                    errors.append(f"README.md:{start + offset}: build/examples/{name} is not built by tools/main.sh (ladder: {' '.join(sorted(built))})")

    quickstart = readme.find("## Quickstart")
    following = [b for b in sh_blocks(readme[quickstart:])] if quickstart >= 0 else []
    if not following:
        errors.append("README.md: the Quickstart section has no ```sh block with the command that runs it")
    else:
        command = [l for l in following[0][1] if l.strip() and not l.strip().startswith("#")]
        if len(command) != 1 or not command[0].strip().startswith("build/examples/quickstart"):
            errors.append(f"README.md: the Quickstart's command should be `build/examples/quickstart`, found {command}")
        else:
            argv = shlex.split(command[0])
            cwd = root
            if build != os.path.join(root, "build"):  # another build folder: its own program
                argv[0] = os.path.join(build, os.path.relpath(argv[0], "build"))
            print("running", " ".join(argv), "in", cwd)
            done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
            print(done.stdout, end="")
            if done.returncode != 0:
                errors.append(f"`{command[0]}` exited with {done.returncode}: {done.stderr.strip()}")
            elif not re.search(r"^step 200\s+loss", done.stdout, re.M):
                errors.append(f"`{command[0]}` did not print the loss at step 200")
    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    print(f"README commands: ok (tools/main.sh builds {' '.join(sorted(built))})")


if __name__ == "__main__":
    main()
