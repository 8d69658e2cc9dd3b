import json, statistics, sys
from collections import defaultdict
def load(p):
    d=json.load(open(p)); cells=defaultdict(list); sql={}
    for r in d['runs']:
        k=(r['db'],r['workers'],r['mix'],r['variant'])
        cells[k].append(r['jobs_per_s']); sql[k]=r.get('sql_per_job_worker')
    return {k:statistics.median(v) for k,v in cells.items()}, sql
b,bs=load(sys.argv[1]); a,as_=load(sys.argv[2])
print(f"{'cell':42} {'before':>8} {'after':>8} {'ratio':>6}  sql/job(worker) b→a")
worst=[]
for k in sorted(b):
    if k not in a: continue
    r=a[k]/b[k]; worst.append((r,k))
    print(f"{' '.join(map(str,k)):42} {b[k]:8.1f} {a[k]:8.1f} {r:6.2f}  {bs[k]}→{as_[k]}")
ours=[(r,k) for r,k in worst if k[3] in ('ordered','unordered')]
print('fenced cells: median ratio %.2f, min %.2f %s, max %.2f'%(statistics.median(r for r,_ in ours), min(ours)[0], min(ours)[1], max(ours)[0]))
