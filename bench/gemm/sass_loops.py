#!/usr/bin/env python3
"""sass_loops.py SASS_FILE FUNCTION_SUBSTRING -- the static size of each loop of one kernel in a
cuobjdump -sass listing: for every backward branch whose body holds an IMMA, the address range,
its instruction count and how many IMMA / LDGSTS / UBLKCP / UTMALDG it holds. Used to compare
the pipe kernel's stage loop across builds (e.g. `pipe_kernelILi2ELi2ELi3ELb0` = 16 tokens,
B = 128, 3 tiles, no bsum); each ring depth's instantiation shows as its own loop. Test tooling."""
import re
import sys


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    txt = open(sys.argv[1]).read()
    i = txt.find(sys.argv[2])
    if i < 0:
        raise SystemExit(f"no function matching {sys.argv[2]}")
    j = txt.find("Function :", i + 10)
    ins = []
    for line in txt[i:j if j > 0 else None].split("\n"):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    at = {a: k for k, (a, _) in enumerate(ins)}
    for k, (a, t) in enumerate(ins):
        m = re.search(r"BRA (?:`\(.*?\) )?0x([0-9a-f]+)", t)
        head = int(m.group(1), 16) if m else None
        if head is None or head >= a or head not in at:
            continue
        body = [x for _, x in ins[at[head]:k + 1]]
        count = {op: sum(op in x for x in body) for op in ("IMMA", "LDGSTS", "UBLKCP", "UTMALDG")}
        if count["IMMA"]:
            print(f"loop {head:#x}-{a:#x}: {len(body)} instructions, "
                  + ", ".join(f"{op} {n}" for op, n in count.items()))


if __name__ == "__main__":
    main()
