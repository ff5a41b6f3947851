"""Summary of one kernel's Nsight Compute source page (`ncu -i REPORT --page source --csv --print-source sass`):
executed instructions and warp-stall samples in total, the stall reasons, the opcode mix (samples and
executed instructions), and the SASS lines with the most stall samples. Used by `run_gpu.sh ncu`."""
import csv, sys
from collections import defaultdict


def number(text):
    try:
        return float(text.replace(",", "") or 0)
    except ValueError:
        return None


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_source_summary.py SOURCE_PAGE.csv")
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
    header_at = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if header_at is None:
        sys.exit(f"{sys.argv[1]}: no 'Source' column: not an ncu source page in CSV form")
    header = [c.strip() for c in rows[header_at]]
    try:
        samples_col = header.index("Warp Stall Sampling (All Samples)")
        executed_col = header.index("Instructions Executed")
        source_col = header.index("Source")
    except ValueError as e:
        sys.exit(f"{sys.argv[1]}: missing column ({e}); collect with --set full")
    stall_cols = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    lines = []
    for r in rows[header_at + 1:]:
        samples, executed = number(r[samples_col]), number(r[executed_col])
        if samples is not None and executed is not None:
            lines.append((samples, executed, r))
    total_samples = sum(l[0] for l in lines) or 1.0
    total_executed = sum(l[1] for l in lines) or 1.0
    print(f"samples {total_samples:.0f}, instructions executed {total_executed:.3e}, SASS lines {len(lines)}")
    stalls = defaultdict(float)
    for _, _, r in lines:
        for i in stall_cols:
            stalls[header[i]] += number(r[i]) or 0.0
    print("stall reasons:", ", ".join(f"{k[6:]} {100 * v / total_samples:.1f}%"
                                      for k, v in sorted(stalls.items(), key=lambda x: -x[1])[:10]))
    opcodes = defaultdict(lambda: [0.0, 0.0])
    for samples, executed, r in lines:
        words = [w for w in r[source_col].split() if not w.startswith("@")]
        key = words[0].split(".")[0] if words else "?"
        opcodes[key][0] += samples
        opcodes[key][1] += executed
    print("opcodes (stall samples % / executed %):",
          ", ".join(f"{k} {100 * v[0] / total_samples:.1f}/{100 * v[1] / total_executed:.1f}"
                    for k, v in sorted(opcodes.items(), key=lambda x: -x[1][1])[:20]))
    print("SASS lines with the most stall samples:")
    for samples, executed, r in sorted(lines, key=lambda x: -x[0])[:20]:
        top = max(((number(r[i]) or 0.0, header[i][6:]) for i in stall_cols), default=(0.0, "-"))
        print(f"  {100 * samples / total_samples:5.1f}% x{executed:10.0f}  {r[source_col].strip()[:72]:72s} {top[1]}")


if __name__ == "__main__":
    main()
