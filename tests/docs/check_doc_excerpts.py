#!/usr/bin/env python3
"""Checks that every code block of the docs marked as an excerpt is still what the file it is taken
from holds, so that a worked example CI runs there cannot drift from the copy the docs show.

A block is an excerpt when the line before its opening fence is `<!-- excerpt: PATH -->` (PATH
relative to the repository root). Its `#include` lines and the blank lines after them are left
out (the docs' snippet check hoists them; the file has its own at its top); the rest must appear
in PATH verbatim, as consecutive lines.

Usage:
    check_doc_excerpts.py --root REPO FILE.md...
Prints `file:line: message` for each stale or malformed excerpt and exits 1 if there is one.
"""

import argparse
import os
import re
import sys

MARK_RE = re.compile(r"^\s*<!--\s*excerpt:\s*(\S+)\s*-->\s*$")
FENCE_RE = re.compile(r"^\s*(```+|~~~+)")
INCLUDE_RE = re.compile(r"^\s*#\s*include\s*[<\"]")


def excerpts(lines):
    """(line number of the block's first code line, source path, code lines) for each excerpt."""
    i = 0
    while i < len(lines):
        mark = MARK_RE.match(lines[i])
        if mark and i + 1 < len(lines) and FENCE_RE.match(lines[i + 1]):
            fence = FENCE_RE.match(lines[i + 1]).group(1)
            start = i + 2
            end = start
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            yield start + 1, mark.group(1), lines[start:end], end < len(lines)
            i = end + 1
        else:
            if mark:
                yield i + 1, mark.group(1), None, False
            i += 1


def body(code):
    """The block without its #include lines and the blank lines around them."""
    out = [line for line in code if not INCLUDE_RE.match(line)]
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def longest_match(haystack, needle):
    """How many leading lines of `needle` appear consecutively somewhere in `haystack` (at most all)."""
    best = 0
    for k in range(len(haystack)):
        n = 0
        while n < len(needle) and k + n < len(haystack) and haystack[k + n] == needle[n]:
            n += 1
        best = max(best, n)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    errors, checked = [], 0
    for path in args.files:
        shown = os.path.relpath(os.path.abspath(path), os.path.abspath(args.root))
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for line, source, code, closed in excerpts(lines):
            if code is None:
                errors.append(f"{shown}:{line}: an excerpt mark must be followed by a fenced code block")
                continue
            if not closed:
                errors.append(f"{shown}:{line}: the excerpt's code block is not closed")
                continue
            full = os.path.join(args.root, source)
            if not os.path.isfile(full):
                errors.append(f"{shown}:{line}: the excerpt's source {source} does not exist")
                continue
            with open(full, encoding="utf-8") as f:
                source_lines = f.read().split("\n")
            wanted = body(code)
            if not wanted:
                errors.append(f"{shown}:{line}: the excerpt of {source} is empty")
            else:
                matched = longest_match(source_lines, wanted)
                if matched < len(wanted):
                    at = line + code.index(wanted[matched]) if wanted[matched] in code else line
                    errors.append(f"{shown}:{at}: this excerpt is no longer in {source} verbatim (from this line: "
                                  f"{wanted[matched].strip()!r}); copy the part of {source} it shows")
            checked += 1
    for e in errors:
        print(e)
    print(f"doc excerpts: {checked} checked, {len(errors)} stale or malformed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
