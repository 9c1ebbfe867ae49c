#!/usr/bin/env python3
"""Import circles between the files of a crate's `src`.

A file imports another when it names an item of it through `crate::`,
`super::` or `self::` (in a `use` or in a path). Test modules
(`#[cfg(test)]` blocks and `tests.rs` files) are left out: a test of a
module naturally reaches back into it. Prints each circle (a strongly
connected group of two or more files, with one cycle through it) and the
count.

    python3 scripts/import-circles.py lock-core lock-redis ...
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def modules(src):
    """module path (tuple) -> file"""
    found = {}
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod",):
                parts = parts[:-1]
            if parts == ["lib"] or parts == ["main"]:
                parts = []
            if parts and parts[-1] == "tests":
                continue
            found[tuple(parts)] = os.path.join(root, name)
    return found


def strip_tests(text):
    """Drops `#[cfg(test)] mod x { ... }` blocks and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    i = 0
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text[i:])
        if not m:
            out.append(text[i:])
            break
        start = i + m.start()
        out.append(text[i:start])
        depth = 0
        j = i + m.end() - 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        i = j + 1
    return "".join(out)


def resolve(mods, here, root, rest):
    base = {"crate": (), "self": here, "super": here[:-1]}[root]
    parts = [p.strip() for p in rest.split("::") if p.strip()]
    while parts and parts[0] == "super":
        base = base[:-1]
        parts = parts[1:]
    path = base
    best = base if base in mods else None
    item = None
    for p in parts:
        path = path + (p,)
        if path in mods:
            best = path
        else:
            item = p
            break
    # An item re-exported by the module named (`crate::LockBackend` for
    # the trait `backend.rs` defines): the module that defines it.
    if best is not None and item is not None and item not in DEFINED.get(best, ()):
        owners = [m for m, names in DEFINED.items() if item in names]
        if len(owners) == 1:
            best = owners[0]
    return best


ITEM = re.compile(r"^\s*pub(?:\([^)]*\))?\s+(?:async\s+)?(?:unsafe\s+)?(?:struct|enum|trait|fn|type|const|static|mod|union)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)
MACRO = re.compile(r"macro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)")
DEFINED = {}


def crate_circles(crate):
    src = os.path.join(crate, "src")
    mods = modules(src)
    DEFINED.clear()
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            text = strip_tests(f.read())
        DEFINED[mod] = set(ITEM.findall(text)) | set(MACRO.findall(text))
    edges = {m: set() for m in mods}
    for mod, path in mods.items():
        # A file's own module: for `a/b.rs`, `self` is (a, b).
        with open(path, encoding="utf-8") as f:
            text = strip_tests(f.read())
        for m in PATH.finditer(text):
            target = resolve(mods, mod, m.group(1), m.group(2))
            if target is not None and target != mod and not is_ancestor(target, mod):
                edges[mod].add(target)
        for m in GROUP.finditer(text):
            # `use crate::{a, b::c}`: each name in the group.
            body = group_body(text, m.end() - 1)
            prefix = m.group(2)
            for item in re.split(r",(?![^{]*\})", body):
                item = item.strip().split(" as ")[0].split("::{")[0]
                if not item:
                    continue
                target = resolve(mods, mod, m.group(1), prefix + "::" + item)
                if target is not None and target != mod and not is_ancestor(target, mod):
                    edges[mod].add(target)
    return sccs(edges)


def is_ancestor(a, b):
    """A parent module named by its child (`super::Thing` for an item the
    parent only re-declares) is not counted: the child is the parent's
    part, as `mod child;` says."""
    return len(a) < len(b) and b[: len(a)] == a


def group_body(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : j]
    return ""


def sccs(edges):
    index = {}
    low = {}
    stack = []
    on = set()
    out = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def name(mod):
    return "::".join(mod) or "lib"


def main():
    crates = sys.argv[1:] or sorted(
        d for d in os.listdir(".") if os.path.isfile(os.path.join(d, "Cargo.toml")) and os.path.isdir(os.path.join(d, "src"))
    )
    total = 0
    for crate in crates:
        for group in crate_circles(crate):
            total += 1
            print(f"{crate}: {' <-> '.join(name(m) for m in group)}")
    print(f"import circles: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
