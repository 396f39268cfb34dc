#!/usr/bin/env python3
"""Medians of bench/results/curve/curve.json and the ratios bench/results/HISTORY.md quotes (CURVE section).
   /usr/bin/python3 bench/results/curve/summarize.py bench/results/curve/curve.json"""
import json,sys
d=json.load(open(sys.argv[1]))
rows={}
for b in d['benchmarks']:
    if b.get('run_type')=='aggregate' and b['aggregate_name'] in ('median','cv'):
        n=b['run_name'].split('/iterations')[0]
        rows.setdefault(n,{})[b['aggregate_name']]=b
def rate(n): return rows[n]['median'].get('bytes_per_second',0)/1e9
for n in sorted(rows):
    m=rows[n]['median']; cv=rows[n]['cv']
    print(f"{n:40s} {m['real_time']:9.3f} {m['time_unit']} {rate(n):6.3f} GB/s cv={cv['real_time']*100:.1f}% vs_raw={m.get('vs_raw',float('nan')):.3f}")
for size in ('1MiB','16MiB'):
    print(size, 'raw curve/plain', rate(f'raw/tcp_curve/{size}')/rate(f'raw/tcp/{size}'),
          'raw_chunked curve/plain', rate(f'raw_chunked/tcp_curve/{size}')/rate(f'raw_chunked/tcp/{size}'))
    for w in ('1s1w','2s2w'):
        print(size,w,'ps curve/plain', rate(f'ps/pushpull/tcp_curve/{size}/{w}')/rate(f'ps/pushpull/tcp/{size}/{w}'),
              'ps curve / raw_chunked curve', rate(f'ps/pushpull/tcp_curve/{size}/{w}')/rate(f'raw_chunked/tcp_curve/{size}'))
print(d['context']['date'], d['context']['num_cpus'], d['context']['mhz_per_cpu'])
for size in ('1MiB', '16MiB'):
    crypto = rate(f'crypto/box_seal_open/{size}')
    print(size, 'crypto seal+open GB/s', round(crypto, 3),
          'raw/tcp_curve / crypto', round(rate(f'raw/tcp_curve/{size}') / crypto, 3),
          'raw_chunked/tcp_curve / crypto', round(rate(f'raw_chunked/tcp_curve/{size}') / crypto, 3),
          'ps 1s1w curve / crypto', round(rate(f'ps/pushpull/tcp_curve/{size}/1s1w') / crypto, 3))
