#!/usr/bin/env python3
"""List the import circles of src/: between top-level modules, and between the files of a folder.

Every `crate::`, `$crate::`, `super::` and `self::` path in non-test code (files named
`*_tests.rs` or `tests.rs`, `#[cfg(test)]` modules and items, and comments are skipped; `--tests`
keeps them) is resolved to the module file it names, following `pub use` re-exports, and each
strongly connected component of the resulting graph is printed with one example line per edge.
A module's declaration of its children (`mod x;`) is not an import.

With `--apart A,B` (repeatable) the exit status is 1 when top-level modules A and B are in one
circle, or when any folder's files are (a layer below must not import the layer above);
`make lint` runs it so.

usage: tools/import_circles.py [--src src] [--tests] [--folder NAME ...] [--apart A,B ...]
"""
import sys
import argparse
import os
import re
from collections import defaultdict

CFG_TEST = re.compile(
    r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?(mod\s+\w+\s*\{|use\s[^;]*;|mod\s+\w+\s*;)")
USE = re.compile(r"(?m)^[ \t]*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])(\$?crate|super|self)((?:::\w+)+)")


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def without_tests(text):
    """Blank out comments and `#[cfg(test)]` items, keeping line numbers."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in CFG_TEST.finditer(text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        j = m.end()
        if m.group(1).endswith("{"):
            depth = 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
        out.append("\n" * text[m.start():j].count("\n"))
        i = j
    out.append(text[i:])
    return "".join(out)


def expand(tree):
    """`a::{b, c::{d, e as f}}` -> [(a::b, b), (a::c::d, d), (a::c::e, f)]"""
    tree = re.sub(r"\s+", " ", tree).strip()
    if "{" in tree:
        k = tree.index("{")
        prefix, inner = tree[:k], tree[k + 1:tree.rindex("}")]
        parts, depth, start = [], 0, 0
        for n, c in enumerate(inner):
            depth += {"{": 1, "}": -1}.get(c, 0)
            if c == "," and depth == 0:
                parts.append(inner[start:n])
                start = n + 1
        parts.append(inner[start:])
        return [(prefix + p, name) for part in parts if part.strip() for p, name in expand(part)]
    path, _, alias = tree.partition(" as ")
    path = path.replace(" ", "")
    return [(path, alias.strip() or path.split("::")[-1])]


def absolute(module, path):
    segs = path.split("::")
    if segs[0] in ("crate", "$crate"):
        return segs[1:]
    cur = list(module)
    if segs[0] == "self":
        return cur + segs[1:]
    while segs and segs[0] == "super":
        cur, segs = cur[:-1], segs[1:]
    return cur + segs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="src")
    ap.add_argument("--tests", action="store_true", help="include test code")
    ap.add_argument("--folder", nargs="*", default=["server", "cluster", "protocol", "admin", "core"],
                    help="folders whose files to check against each other")
    ap.add_argument("--apart", action="append", default=[], metavar="A,B",
                    help="fail when these two top-level modules are in one circle, or any folder has one")
    args = ap.parse_args()

    files = {}
    for root, _, names in os.walk(args.src):
        if os.path.relpath(root, args.src).split(os.sep)[0] == "bin":
            continue
        for n in names:
            if not n.endswith(".rs") or n == "main.rs":
                continue
            if not args.tests and (n.endswith("_tests.rs") or n == "tests.rs"):
                continue
            path = os.path.join(root, n)
            files[module_of(args.src, path)] = path
    modules = set(files)

    reexports = defaultdict(dict)  # module -> {name: absolute path}
    refs = defaultdict(list)  # module -> [(line, absolute path, is a re-export of a folder)]
    for module, path in files.items():
        text = open(path).read()
        if not args.tests:
            text = without_tests(text)
        folder_file = path.endswith(("mod.rs", "lib.rs"))
        children = {m[-1] for m in modules if m[:-1] == module and len(m) == len(module) + 1}
        for m in USE.finditer(text):
            line = text[:m.start()].count("\n") + 1
            for p, name in expand(m.group(2)):
                first = p.split("::")[0]
                if first in children:
                    p = "self::" + p
                elif first not in ("crate", "$crate", "super", "self"):
                    continue  # another crate
                a = absolute(module, p)
                if m.group(1):
                    reexports[module][name] = a
                refs[module].append((line, a, bool(m.group(1)) and folder_file))
        for m in PATH.finditer(text):
            line = text[:m.start()].count("\n") + 1
            refs[module].append((line, absolute(module, m.group(1) + m.group(2)), False))

    def resolve(path, depth=0):
        cur = ()
        for k, seg in enumerate(path):
            if cur + (seg,) in modules:
                cur += (seg,)
            elif seg in reexports.get(cur, {}) and depth < 10:
                return resolve(list(reexports[cur][seg]) + list(path[k + 1:]), depth + 1)
            else:
                break
        return cur

    edges = {}  # (from, to) -> example
    for module, lst in refs.items():
        for line, a, folder_reexport in lst:
            if folder_reexport:
                continue  # followed where it is used
            target = resolve(a)
            if target and target != module and module[:len(target)] != target:
                edges.setdefault((module, target), f"{files[module]}:{line} {'::'.join(a)}")

    def report(title, key):
        graph = defaultdict(dict)
        for (a, b), example in sorted(edges.items()):
            ka, kb = key(a), key(b)
            if ka is not None and kb is not None and ka != kb:
                graph[ka].setdefault(kb, example)
        index, low, stack, on, comps = {}, {}, [], set(), []

        def visit(v):
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in graph.get(v, {}):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

        for v in sorted(graph):
            if v not in index:
                visit(v)
        print(f"== {title}: {len(comps)} circle(s)")
        circles.extend(comps)
        for comp in sorted(comps):
            print("  {" + ", ".join(comp) + "}")
            for a in comp:
                for b, example in sorted(graph.get(a, {}).items()):
                    if b in comp:
                        print(f"    {a} -> {b}   ({example})")

    circles = []
    report("top-level modules", lambda m: m[0] if m else None)
    top = list(circles)
    for folder in args.folder:
        report(f"files in {folder}/",
               lambda m, f=folder: ("/".join(m[1:]) or "mod") if m[:1] == (f,) else None)
    bad = [f"{a} and {b} in one circle" for a, b in (x.split(",", 1) for x in args.apart)
           if any(a in c and b in c for c in top)]
    if args.apart and len(circles) > len(top):
        bad.append("a circle between the files of a folder")
    for why in bad:
        print(f"error: {why}", file=sys.stderr)
    sys.exit(1 if bad else 0)


main()
