import subprocess,sys,re
# nsop.py file cpu_frac ops [file cpu ops]...: per-symbol ns/op side by side
args=sys.argv[1:]; cols=[]
for i in range(0,len(args),3):
    f,cpu,ops=args[i],float(args[i+1]),float(args[i+2])
    out=subprocess.run(["perf","report","-i",f,"--no-children","--sort","symbol","-g","none","--stdio"],capture_output=True,text=True).stdout
    d={}
    for l in out.splitlines():
        m=re.match(r"\s+([\d.]+)%\s+\[(.)\]\s+(.*?)\s*$",l)
        if m: k=m.group(3)[:70].rstrip(); d[k]=d.get(k,0)+float(m.group(1))/100*cpu*1e9/ops
    cols.append(d)
keys=sorted(set().union(*cols),key=lambda k:-max(c.get(k,0) for c in cols))
print("%-72s"%"symbol"+"".join("%10s"%a for a in args[0::3]))
print("%-72s"%"TOTAL"+"".join("%10.1f"%sum(c.values()) for c in cols))
for k in keys[:int(sys.argv[0] and 45)]:
    print("%-72s"%k+"".join("%10.1f"%c.get(k,0) for c in cols))
