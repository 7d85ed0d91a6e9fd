#!/usr/bin/env python3
"""Checks that olmax's headers include each other only along the declared layering.

The rule lives in ONE place: the table between the markers `<!-- layering:begin -->` and
`<!-- layering:end -->` in docs/ARCHITECTURE.md. Each row is

    | <layer number> | `<module>` | `<allowed>`, `<allowed>`, ... |

where a module is a folder under include/olmax/ (`core`) or a file directly in it (`olmax.hpp`),
and an allowed entry is a module (any of its public headers) or one header of it
(`backend/default.hpp`); `-` means nothing. A module may always include its own headers. Every
allowed entry must sit in a lower layer than the row, so the table cannot describe a cycle.

Besides the table, every header is checked for:
  * includes of another module's `detail/` folder (module-private, e.g. olmax/scan/detail/...);
  * quoted includes that do not start with `olmax/`, and any include with `..` in its path
    (a relative path escapes the layering, e.g. "../shared/reference/...");
  * includes of olmax headers that do not exist;
  * citations of reference notes that are not in the repository (REFERENCE_NOTES below): a comment
    must carry the fact itself or point into docs/.

Usage:
    check_layering.py --include-root include --table docs/ARCHITECTURE.md
    check_layering.py --self-test      # runs the checker on tests/layering/fixture, which must
                                        # produce exactly the violations in fixture/expected.txt
Prints one line per violation, `path:line: message`, and exits 1 when there is any.
"""

import argparse
import os
import re
import sys

BEGIN_MARKER = "<!-- layering:begin -->"
END_MARKER = "<!-- layering:end -->"

# Notes that live outside this repository (they were next to it while olmax was written). A header
# that names one points readers at a file they do not have.
REFERENCE_NOTES = (
    "olmax-techniques.md",
    "scan-strategies.md",
    "tpu-dispatch.md",
    "cpp-style-anchors.md",
    "shared/reference",
)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


class Table:
    """The layering table: module -> (layer, allowed modules, allowed single headers)."""

    def __init__(self):
        self.layer = {}
        self.allowed_modules = {}
        self.allowed_headers = {}
        self.text = {}  # module -> the allowed cell as written, for messages

    def allows(self, source, target_module, target_path):
        """Whether module `source` may include header `target_path` (relative to olmax/)."""
        if source == target_module:
            return True
        return target_module in self.allowed_modules[source] or target_path in self.allowed_headers[source]


def strip_cell(cell):
    return cell.strip().strip("`").strip()


def module_of(path_in_olmax):
    """`core/tensor.hpp` -> `core`; `olmax.hpp` -> `olmax.hpp`."""
    return path_in_olmax.split("/")[0]


def parse_table(table_path, shown_table):
    """Reads the table; returns (Table, errors). `shown_table` names the file in messages."""
    errors = []
    table = Table()
    try:
        with open(table_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return table, [f"{shown_table}: cannot read the layering table: {e}"]
    try:
        begin = lines.index(BEGIN_MARKER)
        end = lines.index(END_MARKER)
    except ValueError:
        return table, [f"{shown_table}: no layering table (markers {BEGIN_MARKER} ... {END_MARKER})"]
    rows = []
    for number in range(begin + 1, end):
        line = lines[number].strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue  # the header row and the |---| separator
        layer = int(cells[0])
        module = strip_cell(cells[1]).rstrip("/")
        entries = [strip_cell(e) for e in cells[2].split(",")]
        entries = [e.rstrip("/") for e in entries if e and e not in ("-", "\u2014")]
        if module in table.layer:
            errors.append(f"{shown_table}:{number + 1}: module {module} appears twice in the layering table")
            continue
        table.layer[module] = layer
        table.allowed_modules[module] = {e for e in entries if not e.endswith(".hpp") or "/" not in e}
        table.allowed_headers[module] = {e for e in entries if e.endswith(".hpp") and "/" in e}
        table.text[module] = ", ".join(entries) if entries else "nothing"
        rows.append((number + 1, module, entries))
    if not rows:
        errors.append(f"{shown_table}: the layering table has no rows")
    for line_number, module, entries in rows:
        for entry in entries:
            target = module_of(entry) if entry.endswith(".hpp") and "/" in entry else entry
            if target not in table.layer:
                errors.append(f"{shown_table}:{line_number}: module {module} may include {entry}, which is not in the table")
            elif table.layer[target] >= table.layer[module]:
                errors.append(f"{shown_table}:{line_number}: module {module} (layer {table.layer[module]}) may include "
                              f"{entry} (layer {table.layer[target]}): allowed includes must point to a lower layer")
    return table, errors


def headers_under(olmax_dir):
    for root, dirs, files in os.walk(olmax_dir):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".hpp", ".h")):
                yield os.path.join(root, name)


def shown_path(path, include_root):
    """`path` relative to the folder that holds `include_root` (the repository root) when it is
    inside it, so that reports read the same from any current folder."""
    base = os.path.dirname(os.path.abspath(include_root))
    rel = os.path.relpath(os.path.abspath(path), base)
    return path if rel.startswith("..") else rel.replace(os.sep, "/")


def check_tree(include_root, table_path):
    """Returns the list of violations, each `path:line: message` (paths as shown_path gives them)."""

    def show(p):
        return shown_path(p, include_root)

    table_shown = show(table_path)
    table, violations = parse_table(table_path, table_shown)
    olmax_dir = os.path.join(include_root, "olmax")
    if not os.path.isdir(olmax_dir):
        return violations + [f"{show(include_root)}: no olmax/ folder"]
    for path in headers_under(olmax_dir):
        rel = os.path.relpath(path, olmax_dir).replace(os.sep, "/")
        shown = show(path)
        source = module_of(rel)
        if source not in table.layer:
            violations.append(f"{shown}:1: module {source} is not in the layering table ({table_shown})")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, start=1):
            where = f"{shown}:{number}"
            for note in REFERENCE_NOTES:
                if note in line:
                    violations.append(f"{where}: cites {note}, a reference note that is not in this repository "
                                      f"(put the fact in the comment or in docs/)")
            match = INCLUDE_RE.match(line)
            if not match:
                continue
            quote, target = match.group(1), match.group(2).strip()
            if ".." in target.split("/"):
                violations.append(f"{where}: includes {target}: a relative path outside the header tree")
                continue
            if not target.startswith("olmax/"):
                if quote == '"':
                    violations.append(f"{where}: includes \"{target}\": include olmax headers as \"olmax/<module>/...\"")
                continue  # <system or third-party header>
            target_path = target[len("olmax/"):]
            target_module = module_of(target_path)
            if not os.path.isfile(os.path.join(olmax_dir, target_path)):
                violations.append(f"{where}: includes {target}, which does not exist")
                continue
            if target_module not in table.layer:
                violations.append(f"{where}: includes {target}: module {target_module} is not in the layering table")
                continue
            parts = target_path.split("/")
            if len(parts) > 2 and parts[1] == "detail" and target_module != source:
                violations.append(f"{where}: module {source} includes {target}, internal to module {target_module}")
                continue
            if not table.allows(source, target_module, target_path):
                violations.append(f"{where}: module {source} includes module {target_module} ({target}; "
                                  f"allowed: {table.text[source]})")
    return violations


def self_test(here):
    fixture = os.path.join(here, "fixture")
    expected_path = os.path.join(fixture, "expected.txt")
    got = check_tree(os.path.join(fixture, "include"), os.path.join(fixture, "layers.md"))
    with open(expected_path, encoding="utf-8") as f:
        expected = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    if got == expected:
        print(f"layering self-test: the fixture's {len(expected)} violations were all reported, and nothing else")
        return 0
    print("layering self-test FAILED: the checker's report on tests/layering/fixture differs from expected.txt")
    for line in expected:
        if line not in got:
            print(f"  missing:    {line}")
    for line in got:
        if line not in expected:
            print(f"  unexpected: {line}")
    if sorted(got) == sorted(expected):
        print("  (same lines, other order)")
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include-root", help="the folder that holds olmax/ (the repository's include/)")
    parser.add_argument("--table", help="the markdown file with the layering table (docs/ARCHITECTURE.md)")
    parser.add_argument("--self-test", action="store_true", help="check the fixture tree and compare with its expected report")
    args = parser.parse_args()
    if args.self_test:
        return self_test(os.path.dirname(os.path.abspath(__file__)))
    if not args.include_root or not args.table:
        parser.error("--include-root and --table are required (or --self-test)")
    violations = check_tree(args.include_root, args.table)
    for v in violations:
        print(v)
    headers = sum(1 for _ in headers_under(os.path.join(args.include_root, "olmax")))
    table = shown_path(args.table, args.include_root)
    if violations:
        print(f"layering: {len(violations)} violation(s) in {headers} headers; the rules are the table in {table}")
        return 1
    print(f"layering: {headers} headers follow the table in {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
