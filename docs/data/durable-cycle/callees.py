import sys,re,subprocess,collections
# callees.py perf.data cpu ops TARGET_REGEX [depth]: inclusive ns/op of TARGET, split by the frames it calls
f,cpu,ops,target=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),sys.argv[4]
depth=int(sys.argv[5]) if len(sys.argv)>5 else 1
out=subprocess.run(["perf","script","-i",f,"-F","comm,ip,sym"],capture_output=True,text=True).stdout
samples=[];cur=[]
for l in out.splitlines():
    if not l.startswith("\t") and not l.startswith(" "*8):
        if cur: samples.append(cur)
        cur=[];continue
    s=l.strip().split(" ",1)
    if len(s)<2: continue
    name=re.sub(r"\+0x[0-9a-f]+.*$","",s[1]); name=re.sub(r"<.*>","<>",name)
    cur.append(name)
if cur: samples.append(cur)
n=len(samples); per=cpu*1e9/ops/n
c=collections.Counter(); tot=0
for st in samples:
    idx=[i for i,x in enumerate(st) if re.search(target,x)]
    if not idx: continue
    i=idx[-1]  # outermost
    tot+=1
    key=" <- ".join(st[max(0,i-depth):i][::-1]) if i>0 else "(self)"
    c[key]+=1
print(f"{target}: {tot*per:.1f} ns/op ({tot} samples of {n})")
for k,v in c.most_common(25): print(f"{v*per:8.1f}  {k[:150]}")
