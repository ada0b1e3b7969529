#!/usr/bin/env python3
"""No circle between the files of pptrain: a unit (a header and the source of the same name,
pptrain/schedule/semantics.h with semantics.cpp) may include the headers of other units, but no
chain of includes may lead back to it. scripts/check_layers.sh keeps the rooms (folders) apart;
this keeps the units inside a room apart too. Unit tests (*_test.cpp) are left out: a test may
include what it tests and more. Prints the units of each circle and exits 1 if there is any.

    scripts/check_circles.py [ROOT]      # default: the repository this script is in
"""
import os
import re
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
os.chdir(root)
try:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "pptrain", "tools", "python/src"],
                            capture_output=True, text=True, check=True).stdout.split()
except (OSError, subprocess.CalledProcessError):
    listed = [os.path.join(d, f) for top in ("pptrain", "tools", "python/src")
              for d, _, files in os.walk(top) for f in files]
include = re.compile(r'^\s*#\s*include\s*[<"]((?:pptrain|tools|python)/[^">]+)[">]', re.M)


def unit(path):
    return re.sub(r"\.(h|cpp)$", "", path)


edges = {}
for path in listed:
    if not path.endswith((".h", ".cpp")) or path.endswith("_test.cpp") or not os.path.exists(path):
        continue
    with open(path, encoding="utf-8") as f:
        text = f.read()
    edges.setdefault(unit(path), set()).update(
        unit(h) for h in include.findall(text) if unit(h) != unit(path))

# Tarjan's strongly connected components, iteratively; a component of two or more is a circle.
index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]
for start in sorted(edges):
    if start in index:
        continue
    work = [(start, iter(sorted(edges.get(start, ()))))]
    index[start] = low[start] = counter[0]
    counter[0] += 1
    stack.append(start)
    on_stack.add(start)
    while work:
        node, children = work[-1]
        child = next(children, None)
        if child is not None:
            if child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

for component in circles:
    print("files in a circle of includes: " + ", ".join(component) +
          " (each leads back to itself through the others' headers)")
if circles:
    sys.exit(1)
print("check_circles: no circle between the files of pptrain")
