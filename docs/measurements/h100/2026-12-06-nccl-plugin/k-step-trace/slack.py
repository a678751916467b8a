import re,sys,collections
pat=re.compile(r'vm:(\d+):(\d+) .*trace (send|recv) req (\d+) \+(\d+)us @(\d+) (.*)')
ev=collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m=pat.search(line)
    if not m: continue
    pid,tid,side,req,t,w,what=m.groups()
    comm=(pid,side,(int(w)-int(t))//2000)
    key=what.split(' ')[0]+" "+what.split(' ')[1]
    ev[(comm,int(req))].setdefault(key,int(w))
sl=[]
for c in sorted({c for c,r in ev if c[1]=="send"}):
    rows=sorted((r,v) for (cc,r),v in ev.items() if cc==c)
    prev=None
    for r,v in rows:
        if "test done" not in v: continue
        ready=max(v.get("ack received",0), v.get("last byte",0))
        if prev: sl.append(v["test done"]-max(ready,prev))
        prev=v["test done"]
sl.sort(); n=len(sl); print("send slack (done - max(ready, prev done)) n=%d p10=%d p50=%d p75=%d p90=%d"%(n,sl[n//10],sl[n//2],sl[3*n//4],sl[9*n//10]))
