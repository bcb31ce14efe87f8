#!/usr/bin/env python3
"""Summarize `ncu -i REPORT --page source --csv --print-source sass` (a report taken with
`--section SourceCounters`): per kernel, the warp instructions executed by opcode, the stall
reasons over all samples, and the instructions that hold the most stall samples.

  scripts/ncu-source.py SOURCE.csv [--kernel SUBSTRING] [--top N] [--listing]

--listing prints every executed instruction (address order) with its executions, samples and
its long-scoreboard / wait / barrier samples, for reading a loop. Used for lab run 255
(docs/lab/2026-11-24-decode-h200.md)."""
import argparse
import collections
import csv
import re


def kernels_of(path):
    out, hdr = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                out.append((row[1], []))
                hdr = None
            elif row[0] == "Address":
                hdr = row
            elif hdr and out:
                out[-1][1].append(dict(zip(hdr, row)))
    return out


def num(v):
    try:
        return int(v)
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--top", type=int, default=8, help="instructions with the most samples")
    ap.add_argument("--listing", action="store_true")
    a = ap.parse_args()
    seen = set()
    for name, ins in kernels_of(a.csv):
        if a.kernel not in name:
            continue
        key = (name, len(ins), sum(num(i.get("Instructions Executed", "0")) for i in ins))
        if key in seen:   # one row per profiled launch: a later launch with the same counts (another layer) is left out
            continue
        seen.add(key)
        samples = sum(num(i.get("Warp Stall Sampling (All Samples)", "0")) for i in ins)
        executed = sum(num(i.get("Instructions Executed", "0")) for i in ins)
        print(f"== {name[:200]}")
        print(f"   {len(ins)} instructions, {executed} warp instructions executed, {samples} stall samples")
        stalls = collections.Counter()
        for i in ins:
            for c, v in i.items():
                if c.startswith("stall_") and "Not Issued" not in c:
                    stalls[c[6:]] += num(v)
        if samples:
            print("   stalls: " + ", ".join(f"{k} {100 * v / samples:.1f}%" for k, v in stalls.most_common(8)))
        ops = collections.Counter()
        for i in ins:
            text = re.sub(r"^@!?U?P\w+\s+", "", i.get("Source", "").strip())
            if text:
                ops[text.split()[0].split(".")[0]] += num(i.get("Instructions Executed", "0"))
        print("   opcodes: " + " ".join(f"{k} {v}" for k, v in ops.most_common(16)))
        ranked = sorted(enumerate(ins), key=lambda p: -num(p[1].get("Warp Stall Sampling (All Samples)", "0")))
        for n, i in ranked[: a.top]:
            print(f"   #{n:<5} {num(i.get('Warp Stall Sampling (All Samples)', '0')):6d} samples  {i.get('Source', '').strip()}")
        if a.listing:
            for n, i in enumerate(ins):
                e = num(i.get("Instructions Executed", "0"))
                if e:
                    print(f"{n:5d} {e:9d} {num(i.get('Warp Stall Sampling (All Samples)', '0')):5d} lsb {num(i.get('stall_long_sb', '0')):4d} "
                          f"wait {num(i.get('stall_wait', '0')):4d} bar {num(i.get('stall_barrier', '0')):4d}  {i.get('Source', '').strip()}")


if __name__ == "__main__":
    main()
