import json,statistics,collections,sys
d=sys.argv[1]
rows=collections.defaultdict(lambda: collections.defaultdict(dict))
for i in range(1,9):
    for v in ('before','after'):
        try: j=json.load(open(f'{d}/pair{i}-{v}.json'))
        except Exception: continue
        for b in j['benchmarks']:
            rows[b['name'].split('/iterations')[0]][v][i]=b['real_time']
for name,vs in rows.items():
    b,a=vs['before'],vs['after']
    pairs=[a[i]/b[i] for i in sorted(set(a)&set(b))]
    slower=sum(1 for r in pairs if r>1)
    unit='us' if '4KiB' in name else 'ms'
    print(f"| `{name}` | {statistics.median(b.values()):.3f} | {statistics.median(a.values()):.3f} | {statistics.median(pairs):.3f} | {slower} of {len(pairs)} | {', '.join(f'{r:.3f}' for r in pairs)} |")
