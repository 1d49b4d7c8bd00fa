import sys,re,subprocess,collections
f,cpu,ops=sys.argv[1],float(sys.argv[2]),float(sys.argv[3])
rules=[("snapshot export","export_into|export_shard|SnapshotMaker|build_snapshot"),
("apply (sm worker)","sm::worker|StateMachine.*apply"),
("raft core","RaftCore|openraft::core::raft_core|openraft::engine"),
("proposer","propose::propose|client_write"),
("log store append","LogStore.*append|encode_entry"),
("conn: batch exec","Store::execute_except"),
("conn: ops_to_log/owned/submit","ops_to_log|owned_body|DurableShard::submit|execute_reading"),
("conn: answer_logged","answer_logged"),
("conn: other","Binary::run|binary::serve"),
("tokio park/driver","Context::park|Driver::turn|park_internal|epoll_wait"),
("tokio sched","run_task|Harness|scheduler"),
]
out=subprocess.run(["perf","script","-i",f,"-F","comm,ip,sym"],capture_output=True,text=True).stdout
samples=[];cur=None
for l in out.splitlines():
    if l and not l[0].isspace() or (l.startswith(" ") and not l.startswith("\t") and re.match(r"^\s*\S+\s*$",l) and not re.match(r"^\s+[0-9a-f]+ ",l)):
        if cur: samples.append(cur)
        cur=(l.strip(),[]);continue
    s=l.strip().split(" ",1)
    if cur is not None and len(s)==2: cur[1].append(s[1])
if cur: samples.append(cur)
n=len(samples);per=cpu*1e9/ops/n;c=collections.Counter()
for comm,st in samples:
    if comm.startswith("log-writer"): c["log-writer thread"]+=1;continue
    for name,rx in rules:
        if any(re.search(rx,x) for x in st): c[name]+=1;break
    else: c["other: "+(st[-1][:40] if st else "?")]+=1
print(f"total {n*per:.0f} ns/op")
for k,v in c.most_common(30): print(f"{v*per:7.1f}  {k}")
