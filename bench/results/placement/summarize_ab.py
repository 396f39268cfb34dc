#!/usr/bin/env python3
"""Summarizes handover_ab.txt (handover_ab.sh): per direction of the move, the median and range of
MoveSlots' time, of the checkpoint before it, of the pause (checkpoint + MoveSlots) in steps, and of the whole read, before and
after, and after / before of each pair's move (the pairs ran alternating)."""
import statistics
import sys

def main(path):
    runs = []  # (pair, which, direction, row dict)
    pair = which = None
    header = None
    for line in open(path):
        if line.startswith("# pair "):
            parts = line.split()
            pair, which = int(parts[2].rstrip(",")), parts[3].rstrip(":")
        elif line.startswith("round"):
            header = line.split()
        elif header and line[:1].isdigit():
            fields = line.split()
            row = dict(zip(header, fields))
            runs.append((pair, which, row["move"], row))
    def med(xs):
        return f"{statistics.median(xs):9.1f} ({min(xs):.1f}-{max(xs):.1f})"
    print(f"{'move':6} {'which':7} {'n':>2} {'move_ms':>24} {'ckpt_ms':>24} {'pause/step':>22} {'read_ms (whole)':>24} "
          f"{'read_moving_ms':>24}")
    for direction in ("1->0", "back"):
        for w in ("before", "after"):
            rows = [r for (_, ww, d, r) in runs if ww == w and d == direction]
            if not rows:
                continue
            moving = [float(r["read_moving_ms"]) for r in rows if "read_moving_ms" in r]
            print(f"{direction:6} {w:7} {len(rows):2} {med([float(r['move_ms']) for r in rows]):>24} "
                  f"{med([float(r['ckpt_ms']) for r in rows]):>24} "
                  f"{med([float(r['pause/step']) for r in rows]):>22} {med([float(r['read_ms']) for r in rows]):>24} "
                  f"{med(moving) if moving else '-':>24}")
        ratios = []
        for p in sorted({p for (p, _, _, _) in runs}):
            b = [r for (pp, w, d, r) in runs if pp == p and w == "before" and d == direction]
            a = [r for (pp, w, d, r) in runs if pp == p and w == "after" and d == direction]
            if a and b:
                ratios.append(float(a[0]["move_ms"]) / float(b[0]["move_ms"]))
        if ratios:
            print(f"{direction:6} MoveSlots after / before, by pair: median {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f}), {len(ratios)} pairs")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "handover_ab.txt")
