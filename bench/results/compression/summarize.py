"""Recomputes bench/results/HISTORY.md "Gradient compression (issue 17)" from run.json (ferry-bench's codec/*
and wire/* cases, 3 repetitions, randomly interleaved).

    python3 bench/results/compression/summarize.py [run.json]

Every figure is the median over the repetitions (min-max beside it where it is a measurement).
"""
import json
import os
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.json")
runs = {}  # name without "/iterations..." -> list of benchmark entries (one per repetition)
for b in json.load(open(path))["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    runs.setdefault(b["run_name"].split("/iterations")[0], []).append(b)


def med(name, key):
    return statistics.median(b[key] for b in runs[name])


def span(name, key, scale=1.0, fmt="%.2f"):
    v = [b[key] * scale for b in runs[name]]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), min(v), max(v))


GB = 1e9
print("## Codecs: float32 GB/s in (encode) and out (decode), and the ratio to a memcpy of the same bytes")
print("| case | n | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy | decode / memcpy | encode ns/elem | decode ns/elem | wire / f32 bytes |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
codec = {}
for name in sorted(n for n in runs if n.startswith("codec/")):
    _, fmt, size = name.split("/")
    elems = int(size[:-1]) << 20
    enc, dec = med(name, "encode_bytes_per_second"), med(name, "decode_bytes_per_second")
    codec[(fmt, size)] = (enc, dec)
    print("| %s | %s | %s | %s | %s | %.3f | %.3f | %.2f | %.2f | %.4f |" % (
        fmt, size, span(name, "encode_bytes_per_second", 1 / GB), span(name, "decode_bytes_per_second", 1 / GB),
        span(name, "memcpy_bytes_per_second", 1 / GB), med(name, "encode_vs_memcpy"), med(name, "decode_vs_memcpy"),
        med(name, "encode_ns_per_elem"), med(name, "decode_ns_per_elem"), med(name, "wire_bytes") / (4.0 * elems)))

print()
print("## Push+pull through Ferry, 1 server 1 worker, tcp loopback: ms a call, bytes on the wire a call")
print("| size | format | ms a call: median (min-max) | / f32 | wire bytes a call | / f32 |")
print("|---|---|---:|---:|---:|---:|")
wire = {}
for name in sorted(n for n in runs if n.startswith("wire/")):
    parts = name.split("/")
    size, fmt = parts[3], parts[4]
    wire[(size, fmt)] = (med(name, "ms_per_call"), med(name, "wire_bytes_per_call"))
for (size, fmt), (ms, wb) in sorted(wire.items(), key=lambda kv: (kv[0][0] != "1MiB", kv[0][1] != "f32", kv[0][1])):
    base_ms, base_wb = wire[(size, "f32")]
    name = "wire/pushpull/tcp/%s/%s" % (size, fmt)
    print("| %s | %s | %s | %.3f | %.0f | %.4f |" % (size, fmt, span(name, "ms_per_call"), ms / base_ms, wb, wb / base_wb))

print()
print("## Break-even network rate: compression pays when bytes saved / rate > encode + decode time")
print("Per push+pull of S bytes of float32, from the codec rates at n = 1M (one 4 MiB chunk) and at 16M:")
print("fp16/bf16 encode and decode S twice (the push on the worker and the server, the pull on the server")
print("and the worker) and save S; top-k encodes and decodes S once (the push) and saves S (1 - 2r) with")
print("float32 values; top-k with fp16 values saves S (1 - 1.5r) on the push and S / 2 on the fp16 pull.")
print("| case | n | codec s per GB of S | bytes saved / S | break-even GB/s | break-even Gbit/s |")
print("|---|---:|---:|---:|---:|---:|")
breakeven = {}
for size in ("1M", "16M"):
    for fmt, saved in (("fp16", 0.5 * 2), ("bf16", 0.5 * 2), ("topk0.1", 1 - 2 * 0.1), ("topk0.01", 1 - 2 * 0.01),
                       ("topk0.001", 1 - 2 * 0.001), ("topk0.01_fp16", 1 - 1.5 * 0.01 + 0.5)):
        enc, dec = codec[(fmt, size)]
        seconds = 1 / enc + 1 / dec  # per byte of S, once
        if fmt in ("fp16", "bf16"):
            seconds *= 2
        if fmt == "topk0.01_fp16":
            e16, d16 = codec[("fp16", size)]
            seconds += 1 / e16 + 1 / d16
        rate = saved / seconds
        breakeven[(fmt, size)] = rate
        print("| %s | %s | %.3f | %.3f | %.2f | %.1f |" % (fmt, size, seconds * GB, saved, rate / GB, rate * 8 / GB))

print()
print("## Loopback's own rate, for comparison: float32 push+pull payload (2 S) over the f32 call time")
for size, s_bytes in (("1MiB", 1 << 20), ("16MiB", 16 << 20)):
    ms, _ = wire[(size, "f32")]
    print("- %s: %.2f GB/s (%.1f Gbit/s)" % (size, 2 * s_bytes / (ms / 1e3) / GB, 2 * s_bytes / (ms / 1e3) * 8 / GB))

print()
print("## A 16 MiB push+pull at a given network rate (transfer + codec time from the rates above, n = 16M)")
print("| network | f32 ms | fp16 ms | bf16 ms | topk0.01 ms | topk0.01_fp16 ms |")
print("|---|---:|---:|---:|---:|---:|")
S = 16 << 20
for gbit in (1, 10, 25, 100):
    rate = gbit * GB / 8
    row = ["%d Gbit/s" % gbit, "%.1f" % (2 * S / rate * 1e3)]
    for fmt, moved in (("fp16", S), ("bf16", S), ("topk0.01", S + S * 2 * 0.01), ("topk0.01_fp16", S / 2 + S * 1.5 * 0.01)):
        enc, dec = codec[(fmt, "16M")]
        codec_s = S / enc + S / dec
        if fmt in ("fp16", "bf16"):
            codec_s *= 2
        if fmt == "topk0.01_fp16":
            e16, d16 = codec[("fp16", "16M")]
            codec_s += S / e16 + S / d16
        row.append("%.1f" % ((moved / rate + codec_s) * 1e3))
    print("| " + " | ".join(row) + " |")
