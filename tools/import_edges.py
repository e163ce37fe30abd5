#!/usr/bin/env python3
"""Import edges of the crate: which top-level module's code names which other's (`crate::X`,
comments left out; the logging macros count as `log`), which file of `src/cluster/` names
which other (`super::X`, `crate::cluster::X`), and the circles among either. A layer below
must not import the one above: exit status 1 when two modules named apart (by default
`cluster` and `server`) are in one circle.

usage: tools/import_edges.py [SRC_DIR] [--apart A,B ...]   (default: src --apart cluster,server)
"""
import os
import re
import sys

CRATE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `crate::cluster::X`, or `super::X` in a file directly in src/cluster/.
CLUSTER = re.compile(r"\b(?:crate::cluster|super)::([a-z_][a-z0-9_]*)")


def code_lines(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            code = line.split("//", 1)[0]
            if code.strip():
                yield code


def top_module(src, path):
    rel = os.path.relpath(path, src).split(os.sep)
    return rel[0][:-3] if len(rel) == 1 else rel[0]


def circles(edges):
    """Every strongly connected set of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    nodes = sorted({a for a, _ in edges} | {b for _, b in edges})

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for a, b in sorted(edges):
            if a != v:
                continue
            if b not in index:
                visit(b)
                low[v] = min(low[v], low[b])
            elif b in on:
                low[v] = min(low[v], index[b])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    apart = [a.split(",") for i, a in enumerate(args) if i > 0 and args[i - 1] == "--apart"]
    rest = [a for i, a in enumerate(args) if a != "--apart" and (i == 0 or args[i - 1] != "--apart")]
    src = rest[0] if rest else "src"
    apart = apart or [["cluster", "server"]]
    tops = {}
    cluster_files = {}
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            top = top_module(src, path)
            if top in ("main", "lib"):
                continue
            in_cluster = os.path.dirname(path) == os.path.join(src, "cluster")
            me = name[:-3]
            for code in code_lines(path):
                for m in CRATE.finditer(code):
                    to = "log" if m.group(1).startswith("log_") else m.group(1)
                    if to != top:
                        tops.setdefault((top, to), set()).add(os.path.relpath(path, src))
                if in_cluster and me != "mod":
                    for m in CLUSTER.finditer(code):
                        other = m.group(1)
                        if other != me and os.path.exists(os.path.join(src, "cluster", other + ".rs")):
                            cluster_files.setdefault((me, other), set()).add(name)
    print("top-level modules (from -> to: the files that name it):")
    for (a, b), files in sorted(tops.items()):
        print(f"  {a} -> {b}: {', '.join(sorted(files))}")
    print("src/cluster/ files (from -> to):")
    for (a, b) in sorted(cluster_files):
        print(f"  {a} -> {b}")
    bad = False
    for label, edges in (("top-level modules", tops), ("src/cluster/ files", cluster_files)):
        found = circles(set(edges))
        for c in found:
            print(f"circle among {label}: {{{', '.join(c)}}}")
        if not found:
            print(f"no circle among {label}")
        for pair in apart:
            for c in found:
                if all(p in c for p in pair):
                    print(f"error: {' and '.join(pair)} import each other (a circle)")
                    bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
