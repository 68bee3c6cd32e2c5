#!/usr/bin/env python3
"""loom's layer rules (docs/DESIGN.md, "Layers"): fails, naming each offending line, when a quoted #include
of a source file reaches a layer its own layer must not use.

Usage: layers_test.py [SOURCE_ROOT]   (default: the folder above tests/)

Each quoted include is resolved as the compiler resolves it with the project's include folders: the including
file's folder, then the source root, then include/. An include that resolves to no file of the tree (a system
or generated header) is not a layer's concern. Reads files only.
"""
import os
import re
import sys

# Layers, most specific first: a file belongs to the first whose folder holds it.
LAYERS = ["include", "src/base", "algorithms", "transports", "src/exec", "src/topology", "src/tuner", "src/core",
          "src/ep", "parallel", "perf", "plugins", "tools", "tests"]

# What each layer may include besides itself. tools/ and tests/ may include anything.
ALLOWED = {
    "include": [],
    "src/base": ["include"],
    "algorithms": ["include", "src/base"],
    "transports": ["include", "src/base"],
    "src/exec": ["include", "src/base", "algorithms", "transports"],
    "src/topology": ["include", "src/base"],
    "src/tuner": ["include", "src/base", "algorithms", "transports", "src/exec", "src/topology"],
    "src/core": ["include", "src/base", "algorithms", "transports", "src/exec", "src/topology", "src/tuner"],
    "src/ep": ["include", "src/base", "algorithms", "transports", "src/exec", "src/topology", "src/tuner",
               "src/core"],
    "parallel": ["include"],
    "perf": ["include"],
    "plugins": ["include", "src/base"],
    "tools": LAYERS,
    "tests": LAYERS,
}

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".c", ".cpp", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SKIP_DIRS = {".git", "subprojects"}


def layer_of(path):
    for layer in LAYERS:
        if path == layer or path.startswith(layer + "/"):
            return layer
    return None


def transport_of(path):
    """The concrete transport a transports/ path belongs to (transports/tcp/x.cc: tcp), or None for the shared
    files at transports/'s top (the Transport interface, FIFOs, proxy)."""
    parts = path.split("/")
    return parts[1] if parts[0] == "transports" and len(parts) > 2 else None


def resolve(root, source, name):
    for candidate in (os.path.join(os.path.dirname(source), name), name, os.path.join("include", name)):
        candidate = os.path.normpath(candidate)
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate.replace(os.sep, "/")
    return None


def why_crossing(source, target):
    """Why `source` must not include `target`, or None when it may."""
    own, other = layer_of(source), layer_of(target)
    if own is None or other is None:
        return None
    if other != own and other not in ALLOWED[own]:
        return f"{own}/ may use {', '.join(x + '/' for x in ALLOWED[own]) or 'nothing else'}, not {other}/"
    # Concrete transports stay apart: none includes another, and no layer but tools/, tests/ and transports/
    # itself reaches into one (they see the Transport interface and the FIFOs, at transports/'s top).
    concrete = transport_of(target)
    if other == "transports" and concrete is not None and own not in ("tools", "tests"):
        mine = transport_of(source)
        if own != "transports" or (mine is not None and mine != concrete):
            return f"only transports/{concrete}/ itself includes transports/{concrete}/"
        if mine is None:
            return f"transports/'s shared files must not include a concrete transport (transports/{concrete}/)"
    return None


def sources(root):
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not (rel == "." and d.startswith("build")))
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.normpath(os.path.join(rel, name)).replace(os.sep, "/")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
    crossings, checked = [], 0
    for source in sources(root):
        with open(os.path.join(root, source), errors="replace") as text:
            for number, line in enumerate(text, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = resolve(root, source, match.group(1))
                if target is None:
                    continue
                checked += 1
                why = why_crossing(source, target)
                if why:
                    crossings.append(f"{source}:{number}: includes {target}: {why}")
    for crossing in crossings:
        print(crossing)
    if checked == 0:
        print(f"layers: no include found under {root}: is it loom's source root?")
        return 1
    print(f"layers: {len(crossings)} of {checked} includes cross the layer rules" if crossings else
          f"layers: none of {checked} includes crosses the layer rules")
    return 1 if crossings else 0


if __name__ == "__main__":
    sys.exit(main())
