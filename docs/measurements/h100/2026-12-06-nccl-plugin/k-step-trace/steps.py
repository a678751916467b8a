import re,sys,collections,statistics as S
pat=re.compile(r'vm:(\d+):(\d+) .*trace (send|recv) req (\d+) \+(\d+)us @(\d+) (.*)')
ev=collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m=pat.search(line)
    if not m: continue
    pid,tid,side,req,t,w,what=m.groups()
    comm=(pid,side,(int(w)-int(t))//2000)
    key=re.sub(r'\d+','N',what.split(' (')[0])[:30]
    ev[(comm,int(req))].setdefault(key,int(w))
def q(xs):
    xs=sorted(xs); n=len(xs)
    return "n=%d p10=%d med=%d p90=%d"%(n,xs[n//10],xs[n//2],xs[9*n//10]) if xs else "-"
sends=[v for (c,r),v in ev.items() if c[1]=="send"]
recvs=[v for (c,r),v in ev.items() if c[1]=="recv"]
def span(vs,a,b): return [v[b]-v[a] for v in vs if a in v and b in v]
print("send isend->test done", q(span(sends,"isend N B tag N eager N/N","test done")), "eager")
print("send isend->test done", q(span(sends,"isend N B tag N to N/N","test done")), "direct")
print("send isend->ack", q(span(sends,"isend N B tag N eager N/N","ack received")))
print("recv irecv->test done", q(span(recvs,"irecv N buffers","test done")))
# posting gaps per comm
for side,k in (("send","isend"),("recv","irecv")):
    bycomm=collections.defaultdict(list)
    for (c,r),v in ev.items():
        if c[1]==side:
            t=[x for kk,x in v.items() if kk.startswith(k)]
            if t: bycomm[c].append((r,t[0]))
    for c,l in bycomm.items():
        l.sort(); gaps=[b[1]-a[1] for a,b in zip(l,l[1:])]
        print(side,c,"gap between posts",q(gaps), "span", l[-1][1]-l[0][1], "us for", len(l))
print("--- send steps (eager)")
E=[v for v in sends if "isend N B tag N eager N/N" in v]
order=["isend N B tag N eager N/N","first byte written","last byte written","ack received","test done"]
for a,b in zip(order,order[1:]):
    print("%-28s -> %-20s"%(a[:20],b), q(span(E,a,b)))
print("--- recv steps")
order=["irecv N buffers","clear-to-send N sent","test done"]
for a,b in zip(order,order[1:]):
    print("%-28s -> %-20s"%(a[:20],b), q(span(recvs,a,b)))
