#!/usr/bin/env bash
# On the GPU machine (the only one with cuobjdump): SASS instruction counts of the kernels in the
# object files under .device/obj (copied there by hand from a -c build), per kernel whose mangled
# name matches $1, by opcode. Used for the instruction-per-byte counts in docs/lab.
set -uo pipefail
source "$(dirname "$0")/device-env.sh" > /dev/null
pat=${1:-mma_kernel}
for o in .device/obj/*.o; do
  /usr/local/cuda/bin/cuobjdump -sass "$o" > "$out/$(basename "$o" .o).sass" 2>&1
  python3 - "$out/$(basename "$o" .o).sass" "$pat" "$(basename "$o")" <<'PY'
import collections, os, re, sys
path, pat, tag = sys.argv[1:4]
cur = None; counts = {}
for line in open(path):
    m = re.search(r"Function : (\S+)", line)
    if m: cur = m.group(1); counts[cur] = collections.Counter(); continue
    m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", line)
    if m and cur: counts[cur][m.group(1)] += 1
for k, c in counts.items():
    if re.search(pat, k):
        top = " ".join(f"{op} {n}" for op, n in c.most_common(14))
        print(f"{tag} {k[-90:]}: total {sum(c.values())}: {top}")
# the matching kernels' SASS alone, for reading
keep = False
with open(path) as f, open(path + "." + pat[:24].replace("/", "_") + ".txt", "w") as o:
    for line in f:
        m = re.search(r"Function : (\S+)", line)
        if m: keep = bool(re.search(pat, m.group(1)))
        if keep: o.write(line)
os.remove(path)
PY
done
