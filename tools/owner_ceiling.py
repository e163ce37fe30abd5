#!/usr/bin/env python3
"""The owner's ceiling: operations per second of one owner thread at
100% (examples/owner_ceiling.rs, wall clock: noisy on a shared machine), and its instructions per
operation under callgrind (stable): two runs of different lengths, the difference divided by the
difference in operations, so that set-up and start-up cancel out.

usage: tools/owner_ceiling.py EXAMPLE_BINARY [DEPTH]
"""
import os, re, subprocess, sys, tempfile

WORKLOADS = ["mc-binary", "mc-text", "lockd", "dlock"]


def instructions(binary, workload, depth, pairs):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             binary, workload, str(depth), "--pairs", str(pairs)],
            capture_output=True, text=True, check=True)
        ops = int(re.search(r"ops=(\d+)", run.stdout).group(1))
        with open(out) as f:
            for line in f:
                if line.startswith("summary:") or line.startswith("totals:"):
                    return ops, int(line.split()[1])
    raise SystemExit("no callgrind totals")


def main():
    binary = sys.argv[1]
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    rates = subprocess.run([binary, "all", str(depth), "2"], capture_output=True, text=True,
                           check=True).stdout
    print(rates, end="")
    for w in WORKLOADS:
        ops1, ir1 = instructions(binary, w, depth, 20_000)
        ops2, ir2 = instructions(binary, w, depth, 120_000)
        print(f"owner_ceiling_instr workload={w} depth={depth} "
              f"instr_per_op={(ir2 - ir1) / (ops2 - ops1):.0f}")


if __name__ == "__main__":
    main()
