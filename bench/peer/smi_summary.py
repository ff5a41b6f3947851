"""Summary of `nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active
--format=csv,noheader -lms 100` samples taken during the training benchmark: the SM clock and power of the
busy samples (power above a third of the limit), and the throttle reasons seen (0x4: software power cap).
Used by `run_gpu.sh perf`."""
import sys
from collections import Counter


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: smi_summary.py SAMPLES.csv")
    rows = []
    for line in open(sys.argv[1], errors="replace"):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or "MHz" not in fields[0]:
            continue
        try:
            rows.append((int(fields[0].split()[0]), float(fields[1].split()[0]), float(fields[2].split()[0]),
                         fields[3]))
        except ValueError:
            continue
    if not rows:
        sys.exit(f"{sys.argv[1]}: no nvidia-smi samples (was nvidia-smi available?)")
    busy = [r for r in rows if r[1] > r[2] / 3]
    if not busy:
        print(f"POWER samples={len(rows)} busy=0 (no sample above a third of the power limit)")
        return
    clocks = sorted(r[0] for r in busy)
    power = sorted(r[1] for r in busy)
    reasons = Counter(r[3] for r in busy).most_common(3)
    print(f"POWER samples={len(rows)} busy={len(busy)} sm_clock_mhz min/median/max={clocks[0]}/"
          f"{clocks[len(clocks) // 2]}/{clocks[-1]} power_w median/max={power[len(power) // 2]:.0f}/{power[-1]:.0f} "
          f"limit={busy[0][2]:.0f} throttle_reasons={reasons}")


if __name__ == "__main__":
    main()
