#!/usr/bin/env bash
# Layer check: every #include in the repository respects the layer order of the build.
#
#   bash scripts/check-layers.sh [REPO_ROOT]     check the tree (default: this script's repository)
#   bash scripts/check-layers.sh --self-test     check that each kind of violation is reported
#
# The layers and their order come from `set(TESSEL_LAYERS ...)` in the root CMakeLists.txt; a layer
# may use only the layers before it. Reported, as "file:line: #include ... : why":
#   - src/<layer>/ or include/tessel/<layer>/ including tessel/<later layer>/...
#   - any file including another layer's private header (a file under src/<other layer>/)
#   - a public header (include/tessel/) including a private header (src/)
#   - tools/ or plugins/ including a private header; tests/<layer>/ may include the private
#     headers of src/<layer>/ only (bench/ is not checked: its micro-benchmarks compile private
#     kernel sources directly, outside the build)
#   - src/<layer>/CMakeLists.txt naming a later layer in DEPENDS, or not listing a .cc/.cu file of
#     src/<layer>/ (likewise tools/CMakeLists.txt for tools/): sources are listed explicitly, so a
#     forgotten file would silently not build
# Exits 1 when anything is reported, 0 otherwise. Needs only bash and python3.
set -euo pipefail

if [[ "${1:-}" == "--self-test" ]]; then
  fixture=$(mktemp -d)
  trap 'rm -rf "$fixture"' EXIT
  mkdir -p "$fixture"/{src/core,src/kernels/cpu,src/sparse,include/tessel/core,include/tessel/kernels,include/tessel/sparse,tools,tests/kernels,tests/sparse}
  echo 'set(TESSEL_LAYERS core kernels sparse)' > "$fixture/CMakeLists.txt"
  echo '#pragma once' > "$fixture/src/kernels/cpu/simd.h"
  echo '#pragma once' > "$fixture/include/tessel/sparse/mask.h"
  echo '#pragma once' > "$fixture/include/tessel/core/tensor.h"
  printf '#include "tessel/core/tensor.h"\n#include "cpu/simd.h"\n' > "$fixture/src/kernels/ok.cc"
  printf '#include "tessel/sparse/mask.h"\n' > "$fixture/src/core/higher.cc"
  printf '#include "kernels/cpu/simd.h"\n' > "$fixture/src/sparse/private.cc"
  printf '#include "../kernels/cpu/simd.h"\n' > "$fixture/src/sparse/relative.cc"
  printf '#include "../../../src/kernels/cpu/simd.h"\n' > "$fixture/include/tessel/kernels/leak.h"
  printf '#include "kernels/cpu/simd.h"\n' > "$fixture/tools/tool.cc"
  printf '#include "cpu/simd.h"\n' > "$fixture/tests/kernels/own_test.cc"
  printf '#include "../../src/kernels/cpu/simd.h"\n' > "$fixture/tests/sparse/other_test.cc"
  printf 'tessel_layer(core SOURCES a.cc DEPENDS sparse)\n' > "$fixture/src/core/CMakeLists.txt"
  output=$(bash "$0" "$fixture" 2>&1) && { echo "self-test: violations not detected"; exit 1; }
  status=0
  for expected in "src/core/higher.cc:1" "src/sparse/private.cc:1" "src/sparse/relative.cc:1" \
                  "include/tessel/kernels/leak.h:1" "tools/tool.cc:1" "tests/sparse/other_test.cc:1" \
                  "src/core/CMakeLists.txt: layer 'core' DEPENDS" \
                  "src/core/higher.cc: not listed in src/core/CMakeLists.txt"; do
    grep -qF "$expected" <<< "$output" || { echo "self-test: not reported: $expected"; status=1; }
  done
  for allowed in "src/kernels/ok.cc" "tests/kernels/own_test.cc"; do
    grep -qF "$allowed" <<< "$output" && { echo "self-test: wrongly reported: $allowed"; status=1; }
  done
  [[ $status == 0 ]] && echo "self-test: every violation reported, allowed includes accepted"
  exit $status
fi

root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
exec python3 - "$root" <<'PY'
import os, re, sys

root = sys.argv[1]
cmake = open(os.path.join(root, "CMakeLists.txt")).read()
match = re.search(r"set\(TESSEL_LAYERS\s+([^)]*)\)", cmake)
if not match:
    sys.exit("check-layers: no set(TESSEL_LAYERS ...) in CMakeLists.txt")
layers = match.group(1).split()
rank = {layer: i for i, layer in enumerate(layers)}
include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
extensions = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
problems = []

def rel(path):
    return os.path.relpath(path, root)

def layer_of_private(path):
    """The layer whose src/<layer>/ holds `path`, or None."""
    parts = rel(path).split(os.sep)
    if len(parts) >= 3 and parts[0] == "src" and parts[1] in rank:
        return parts[1]
    return None

def search_dirs(path):
    """The file's own folder, then the include folders its build target has."""
    parts = rel(path).split(os.sep)
    dirs = [os.path.dirname(path)]
    if parts[0] == "src" and parts[1] in rank:
        dirs.append(os.path.join(root, "src", parts[1]))
    elif parts[0] == "tests":
        dirs.append(os.path.join(root, "tests"))
        if len(parts) > 2 and parts[1] in rank:
            dirs.append(os.path.join(root, "src", parts[1]))
    elif parts[0] == "tools":
        dirs.append(os.path.join(root, "tools"))
    return dirs

def check_file(path):
    parts = rel(path).split(os.sep)
    if parts[0] == "src":
        owner = parts[1] if parts[1] in rank else None
    elif parts[0] == "include":
        owner = parts[2] if len(parts) > 3 and parts[2] in rank else None
    elif parts[0] == "tests" and len(parts) > 2 and parts[1] in rank:
        owner = parts[1]  # may see its own layer's private headers
    else:
        owner = None
    public_header = parts[0] == "include"
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = include_re.match(line)
            if not m:
                continue
            bracket, name = m.groups()
            where = f"{rel(path)}:{number}: #include {bracket}{name}{'>' if bracket == '<' else chr(34)}"
            if name.startswith("tessel/"):
                target_layer = name.split("/")[1]
                if parts[0] in ("src", "include") and owner and target_layer in rank and rank[target_layer] > rank[owner]:
                    problems.append(f"{where}: layer '{owner}' uses the later layer '{target_layer}'")
                continue
            if bracket == "<":
                continue
            resolved = None
            for directory in search_dirs(path):
                candidate = os.path.normpath(os.path.join(directory, name))
                if os.path.isfile(candidate):
                    resolved = candidate
                    break
            if resolved is None:
                # Not on this file's include path: still wrong when it names a private header.
                first = name.split("/")[0]
                candidate = os.path.join(root, "src", name)
                if first in rank and os.path.isfile(candidate):
                    resolved = candidate
                else:
                    continue
            private_layer = layer_of_private(resolved)
            if private_layer is None:
                continue
            if public_header:
                problems.append(f"{where}: a public header includes the private header {rel(resolved)}")
            elif private_layer != owner:
                who = f"layer '{owner}'" if owner else f"'{parts[0]}/'"
                problems.append(f"{where}: {who} includes '{private_layer}''s private header {rel(resolved)}")

for top in ("src", "include", "tools", "tests", "plugins"):
    for directory, _, files in os.walk(os.path.join(root, top)):
        for file in sorted(files):
            if file.endswith(extensions):
                check_file(os.path.join(directory, file))

def check_listed(folder):
    """Every .cc/.cu file under `folder` is named in folder/CMakeLists.txt."""
    lists = os.path.join(folder, "CMakeLists.txt")
    if not os.path.isfile(lists):
        return ""
    text = open(lists).read()
    listed = set(re.findall(r"[\w./-]+\.(?:cc|cu)\b", text))
    for directory, _, files in os.walk(folder):
        for file in sorted(files):
            if file.endswith((".cc", ".cu")) and os.path.relpath(os.path.join(directory, file), folder) not in listed:
                problems.append(f"{rel(os.path.join(directory, file))}: not listed in {rel(lists)}")
    return text

check_listed(os.path.join(root, "tools"))
for layer in layers:
    lists = os.path.join(root, "src", layer, "CMakeLists.txt")
    text = check_listed(os.path.join(root, "src", layer))
    for call in re.finditer(r"tessel_layer\(\s*(\w+)(.*?)\)", text, re.S):
        depends = re.search(r"DEPENDS\s+([\w\s]+)", call.group(2))
        for dependency in (depends.group(1).split() if depends else []):
            if dependency not in rank or rank[dependency] >= rank[layer]:
                problems.append(f"{rel(lists)}: layer '{layer}' DEPENDS on '{dependency}', not an earlier layer")

for problem in problems:
    print(problem)
if problems:
    print(f"check-layers: {len(problems)} violation(s); layer order: {' < '.join(layers)}")
    sys.exit(1)
print(f"check-layers: ok ({' < '.join(layers)})")
PY
