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
    must carry the fact itself or point into docs/;
  * includes of third-party libraries (Eigen, xtensor, xtl, xsimd) anywhere but the top-level
    detail/ folder (third_party.hpp, simd.hpp): one place per dependency;
  * uses of another module's `detail` namespace. A name declared in a namespace `...::detail` is
    internal to the module whose header declares it: `scan::detail::make_geometry` belongs to scan,
    `olmax::detail::norm_ops` to ops (ops keeps its internals in olmax::detail). The exception is
    the library's shared internals, what core and detail/ declare in `olmax::detail` (the tensor's
    shared state through TensorAccess, `concat` for messages): every module may use those, as
    ARCHITECTURE.md's naming rule says. DETAIL_EXCEPTIONS lists the uses that are known and waiting
    for their fix, each with its reason; a listed use that disappears must leave the list.
With --examples DIR, the programs there (*.cpp, the library's user-facing examples) are checked too:
they may use no `detail` name of olmax at all and include no `detail/` header.

Usage:
    check_layering.py --include-root include --table docs/ARCHITECTURE.md [--examples examples]
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

# Third-party libraries that only the headers of the top-level detail/ folder include
# (third_party.hpp for Eigen and xtensor, simd.hpp for xsimd's SIMD API): one place per dependency.
THIRD_PARTY_PREFIXES = ("Eigen/", "unsupported/Eigen/", "xtensor/", "xtl/", "xsimd/")
THIRD_PARTY_HOME = "detail/"

# Modules whose names in `olmax::detail` are the library's shared internals (usable by every module).
SHARED_DETAIL_MODULES = ("core", "detail")

# Known uses of another module's detail names, waiting for their fix: (path under include/olmax, name) -> why.
# The check fails on a listed use that no longer exists, so the list shrinks as they are fixed.
DETAIL_EXCEPTIONS = {
    ("nn/conv.hpp", "norm_ops"): "DenseConv's fused ScaleNorm + leaky ReLU shares ScaleNorm's kernels from ops/norm.hpp; "
                                 "they become a public op when ops/ is next reworked",
    ("trace/tracer.hpp", "allocation_label"): "the tracer's refusal names the op that ran a kernel on traced tensors by "
                                              "reading core's current allocation label; a public accessor for the current "
                                              "op's name in core/memory_profile.hpp would replace it",
}

KEYWORDS = {"decltype", "sizeof", "alignof", "alignas", "requires", "noexcept", "operator", "static_assert", "if", "for",
            "while", "switch", "return", "template", "typename", "explicit", "concept", "throw", "catch", "new", "delete"}


def strip_comments_and_strings(text):
    """The text with comments and string / character literals blanked (newlines kept, so line
    numbers stay), for scanning code only."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            j = text.find("(", i)
            delim = text[i + 2:j]
            k = text.find(")" + delim + '"', j)
            k = n if k < 0 else k + len(delim) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:k]))
            i = k
        elif c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum())):  # 1'000 digit separators stay
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


NAMESPACE_OPEN_RE = re.compile(r"\bnamespace\s+([A-Za-z_][\w:]*)?\s*\{")
ALIAS_RE = re.compile(r"\bnamespace\s+(\w+)\s*=\s*(::)?([\w:]+)\s*;")
DECL_RE = re.compile(r"\b(?:struct|class|union|enum(?:\s+class)?|namespace|concept)\s+(\w+)|\busing\s+(\w+)\s*=|\b(\w+)\s*(?:\(|=|\{|;|\[)")
USE_RE = re.compile(r"((?:::)?(?:\w+::)*)detail::(\w+)")


def without_template_heads(text):
    """`text` without its `template <...>` parameter lists (whose `class T` would read as a declaration)."""
    out, i = [], 0
    for m in re.finditer(r"\btemplate\s*<", text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"<": 1, ">": -1}.get(text[j], 0)
            j += 1
        out.append(text[i:m.start()])
        i = j
    out.append(text[i:])
    return "".join(out)


def scan_namespaces(code):
    """Walks `code` (comments and strings stripped) and yields (position, namespace path, directly
    in a namespace: bool) for each character run between braces, and the declared names: returns
    (declarations, spans) where declarations is a list of (namespace path, name) for names declared
    directly in a namespace whose last part is `detail`, and spans maps positions to paths."""
    declarations = []
    stack = []  # each entry: a namespace path tuple, or None for another brace
    spans = []  # (start, end, path) of text directly inside a namespace or nested deeper
    path = ()
    pos = 0
    segment_start = 0

    def current_path():
        for entry in reversed(stack):
            if entry is not None:
                return entry
        return ()

    def direct():
        return not stack or stack[-1] is not None

    def collect(segment, ns):
        if not ns or ns[-1] != "detail":
            return
        for statement in re.split(r"[;}]", without_template_heads(segment)):
            match = DECL_RE.search(statement)
            while match and (match.group(3) in KEYWORDS):
                match = DECL_RE.search(statement, match.end())
            if match:
                name = match.group(1) or match.group(2) or match.group(3)
                declarations.append((ns, name))

    i = 0
    while i < len(code):
        m = NAMESPACE_OPEN_RE.match(code, i)
        if m and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
            if direct():
                collect(code[segment_start:i], current_path())
            spans.append((segment_start, i, current_path()))
            parts = tuple(p for p in (m.group(1) or "").split("::") if p)
            outer = current_path()
            for j in range(len(parts)):  # `namespace detail::norm_ops {`: norm_ops is declared in a detail namespace
                if (outer + parts[:j])[-1:] == ("detail",):
                    declarations.append((outer + parts[:j], parts[j]))
            stack.append(outer + parts if parts else outer + ("",))
            i = segment_start = m.end()
            continue
        c = code[i]
        if c == "{":
            if direct():
                collect(code[segment_start:i + 1], current_path())
            spans.append((segment_start, i, current_path()))
            stack.append(None)
            segment_start = i + 1
        elif c == "}":
            if direct():
                collect(code[segment_start:i], current_path())
            spans.append((segment_start, i, current_path()))
            if stack:
                stack.pop()
            segment_start = i + 1
        i += 1
    spans.append((segment_start, len(code), current_path()))
    return declarations, spans


def path_at(spans, position):
    for start, end, path in spans:
        if start <= position <= end:
            return path
    return ()


class DetailIndex:
    """Which module declares each name of each detail namespace, read from the headers."""

    def __init__(self, files):
        self.owners = {}  # (namespace path, name) -> set of modules
        for module, code in files:
            declarations, _ = scan_namespaces(code)
            for ns, name in declarations:
                self.owners.setdefault((ns, name), set()).add(module)

    def namespaces_with(self, name):
        return [ns for (ns, n) in self.owners if n == name]

    def resolve(self, qualifier, name, enclosing, aliases):
        """The detail namespace path that `qualifier detail::name` names from inside `enclosing`."""
        parts = [p for p in qualifier.split("::") if p]
        absolute = qualifier.startswith("::")
        if parts and parts[0] in aliases:
            parts = aliases[parts[0]] + parts[1:]
            absolute = True
        candidates = []
        if absolute or (parts and parts[0] == "olmax"):
            candidates.append(tuple(parts) + ("detail",))
        else:
            for k in range(len(enclosing), -1, -1):
                candidates.append(tuple(enclosing[:k]) + tuple(parts) + ("detail",))
        for ns in candidates:
            if (ns, name) in self.owners:
                return ns
        return None


def detail_violations(shown, module, code, index, examples=False):
    """Uses of detail names in `code` that `module` may not make (examples: any olmax detail name)."""
    found = []
    _, spans = scan_namespaces(code)
    aliases = {m.group(1): [p for p in m.group(3).split("::") if p] for m in ALIAS_RE.finditer(code)}
    for m in USE_RE.finditer(code):
        qualifier, name = m.group(1), m.group(2)
        line = code.count("\n", 0, m.start()) + 1
        ns = index.resolve(qualifier, name, path_at(spans, m.start()), aliases)
        if ns is None:
            continue  # not an olmax detail name (std::, or a namespace this file declares itself)
        owners = index.owners[(ns, name)]
        written = "::".join(ns + (name,))
        if examples:
            found.append((line, name, f"{shown}:{line}: uses {written}, internal to olmax (module {', '.join(sorted(owners))}); "
                                      f"an example uses the public API only"))
            continue
        if module in owners:
            continue
        if ns == ("olmax", "detail") and owners & set(SHARED_DETAIL_MODULES):
            continue
        found.append((line, name, f"{shown}:{line}: module {module} uses {written}, internal to module {', '.join(sorted(owners))}"))
    return found


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


def check_tree(include_root, table_path, examples_dir=None, exceptions=None):
    """Returns the list of violations, each `path:line: message` (paths as shown_path gives them)."""

    def show(p):
        return shown_path(p, include_root)

    table_shown = show(table_path)
    table, violations = parse_table(table_path, table_shown)
    olmax_dir = os.path.join(include_root, "olmax")
    if not os.path.isdir(olmax_dir):
        return violations + [f"{show(include_root)}: no olmax/ folder"]
    exceptions = DETAIL_EXCEPTIONS if exceptions is None else exceptions
    sources = []  # (path, rel, module, text) of every header in the table
    for path in headers_under(olmax_dir):
        rel = os.path.relpath(path, olmax_dir).replace(os.sep, "/")
        with open(path, encoding="utf-8", errors="replace") as f:
            sources.append((path, rel, module_of(rel), f.read()))
    index = DetailIndex([(module, strip_comments_and_strings(text)) for _, _, module, text in sources])
    used_exceptions = set()
    for path, rel, source, text in sources:
        shown = show(path)
        if source not in table.layer:
            violations.append(f"{shown}:1: module {source} is not in the layering table ({table_shown})")
            continue
        lines = text.splitlines()
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
                elif target.startswith(THIRD_PARTY_PREFIXES) and not (rel.startswith(THIRD_PARTY_HOME) and rel.count("/") == 1):
                    violations.append(f"{where}: includes <{target}>: only the headers of olmax/{THIRD_PARTY_HOME} include Eigen, "
                                      f"xtensor, xtl and xsimd (include olmax/detail/third_party.hpp or olmax/detail/simd.hpp)")
                continue  # <system header>
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
        for line, name, message in detail_violations(shown, source, strip_comments_and_strings(text), index):
            if (rel, name) in exceptions:
                used_exceptions.add((rel, name))
                continue
            violations.append(message)
    for (rel, name), why in sorted(exceptions.items()):
        if (rel, name) not in used_exceptions and os.path.isdir(olmax_dir):
            violations.append(f"{show(os.path.join(olmax_dir, rel))}:1: DETAIL_EXCEPTIONS lists its use of {name} ({why}), "
                              f"which is gone: remove the entry from tests/layering/check_layering.py")
    if examples_dir:
        for name in sorted(os.listdir(examples_dir)):
            if not name.endswith(".cpp"):
                continue
            path = os.path.join(examples_dir, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for number, line in enumerate(text.splitlines(), start=1):
                match = INCLUDE_RE.match(line)
                if match and match.group(2).startswith("olmax/") and "/detail/" in match.group(2):
                    violations.append(f"{show(path)}:{number}: includes {match.group(2)}, internal to olmax; an example uses "
                                      f"the public API only")
            for _, _, message in detail_violations(show(path), None, strip_comments_and_strings(text), index, examples=True):
                violations.append(message)
    return violations


def self_test(here):
    fixture = os.path.join(here, "fixture")
    expected_path = os.path.join(fixture, "expected.txt")
    exceptions = {("optim/adam.hpp", "op_kernel"): "a listed use, not reported",
                  ("ops/other.hpp", "gone_kernel"): "a listed use that no longer exists"}
    got = check_tree(os.path.join(fixture, "include"), os.path.join(fixture, "layers.md"), os.path.join(fixture, "examples"), exceptions)
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
    parser.add_argument("--examples", help="a folder of example programs (*.cpp) that may use no olmax internals")
    parser.add_argument("--self-test", action="store_true", help="check the fixture tree and compare with its expected report")
    args = parser.parse_args()
    if args.self_test:
        return self_test(os.path.dirname(os.path.abspath(__file__)))
    if not args.include_root or not args.table:
        parser.error("--include-root and --table are required (or --self-test)")
    violations = check_tree(args.include_root, args.table, args.examples)
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
