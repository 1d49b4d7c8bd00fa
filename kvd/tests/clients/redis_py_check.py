"""redis-py against kvd, with its defaults (RESP3 since redis-py 8): run by
kvd/tests/redis_clients.rs with the RESP addresses of a 2-shard cluster and, optionally,
the token. Exits non-zero (an AssertionError and its traceback) on the first difference
from what Redis would answer."""

import asyncio
import sys
import time

import redis
import redis.asyncio


def check_sync(host, port, password):
    r = redis.Redis(host=host, port=port, password=password)
    assert r.connection_pool.connection_kwargs.get("protocol") in (None, 3), "redis-py default"
    assert r.ping() is True
    meta = r.execute_command("HELLO", 3, *(["AUTH", "default", password] if password else []))
    assert meta[b"proto"] == 3, meta
    # 200 keys: about half belong to the other shard and are forwarded by this node.
    for i in range(200):
        assert r.set(f"py{i}", f"v{i}") is True
    for i in range(200):
        assert r.get(f"py{i}") == f"v{i}".encode()
    assert r.get("py-missing") is None
    assert r.mget(["py1", "py-missing", "py2"]) == [b"v1", None, b"v2"]
    assert r.mset({"pa": "1", "pb": "2"}) is True
    assert r.exists("pa", "pb", "py-missing") == 2
    assert r.set("pa", "x", nx=True) is None
    assert r.setnx("pa", "x") is False and r.setnx("pnx", "y") is True
    assert r.set("pa", "3", xx=True) is True
    assert r.getset("pa", "4") == b"3"
    assert r.incr("pcount") == 1 and r.incrby("pcount", 10) == 11 and r.decr("pcount") == 10
    assert r.set("pa-text", "x") is True
    try:
        r.incr("pa-text")
        raise AssertionError("INCR of a non-integer answered")
    except redis.exceptions.ResponseError as e:
        assert "not an integer" in str(e), e
    assert r.delete("pa", "pb", "py-missing") == 2
    # String ops and the other counters.
    assert r.set("ps", "Hello") is True
    assert r.append("ps", " World") == 11 and r.strlen("ps") == 11
    assert r.getrange("ps", 0, 4) == b"Hello" and r.getrange("ps", -5, -1) == b"World"
    assert r.setrange("ps", 6, "Redis") == 11 and r.get("ps") == b"Hello Redis"
    assert r.getdel("ps") == b"Hello Redis" and r.get("ps") is None
    assert r.incrbyfloat("pf", 10.5) == 10.5 and r.incrbyfloat("pf", 0.1) == 10.6
    assert r.decrby("pcount", 3) == 7
    assert r.psetex("ppx", 60_000, "v") is True and 59_000 <= r.pttl("ppx") <= 60_000
    assert r.expireat("ppx", int(time.time()) + 100) is True and 98 <= r.ttl("ppx") <= 100
    assert r.pexpireat("ppx", int(time.time() * 1000) + 50_000) is True and r.pexpiretime("ppx") > 0
    for i in range(64):  # MSETNX on one shard (CROSSSLOT across: the second key is found by trying)
        try:
            assert r.msetnx({"pm0": "a", f"pm{i + 1}": "b"}) is True
            assert r.msetnx({"pm0": "c", f"pm{i + 1}": "d"}) is False and r.get("pm0") == b"a"
            break
        except redis.exceptions.ResponseError as e:
            assert "same slot" in str(e), e
    else:
        raise AssertionError("no MSETNX key on pm0's shard")
    assert r.client_setname("tester") is True
    assert r.client_getname() == "tester" or r.client_getname() == b"tester"
    assert r.info("replication")["role"] == "master"
    assert r.execute_command("ROLE")[0] in (b"master", "master")
    cfg = r.config_get("maxmemory-policy")
    assert cfg.get(b"maxmemory-policy", cfg.get("maxmemory-policy")) in (b"noeviction", "noeviction"), cfg
    # A plain pipeline runs its commands.
    p = r.pipeline(transaction=False)
    p.set("pp1", "a").get("pp1").get("py-missing")
    assert p.execute() == [True, b"a", None]
    # Transactions: MULTI/EXEC through pipeline(), on one shard's keys (a transaction
    # with keys of two shards is refused, CROSSSLOT: the second key is found by trying).
    second = None
    for i in range(64):
        t = r.pipeline(transaction=True)
        t.set("tx1", "a").set(f"txn{i}", 0)
        try:
            t.execute()
            second = f"txn{i}"
            break
        except redis.exceptions.ResponseError as e:
            assert "CROSSSLOT" in str(e) or "EXECABORT" in str(e), e
    assert second is not None, "no key on tx1's shard"
    t = r.pipeline(transaction=True)
    t.set("tx1", "a").get("tx1").incr(second)
    assert t.execute() == [True, b"a", 1], "a transaction"
    # WATCH: a change by another client makes it raise WatchError and run nothing.
    other = redis.Redis(host=host, port=port, password=password)
    with r.pipeline() as t:
        t.watch("txw")
        other.set("txw", "changed")
        t.multi()
        t.set("txw", "mine")
        try:
            t.execute()
            raise AssertionError("a transaction on a changed watched key ran")
        except redis.exceptions.WatchError:
            pass
    assert r.get("txw") == b"changed"
    # The optimistic increment of redis-py's docs, with transaction().
    def incr(pipe):
        v = int(pipe.get("txcount") or 0)
        pipe.multi()
        pipe.set("txcount", v + 1)
    for _ in range(5):
        r.transaction(incr, "txcount")
    assert r.get("txcount") == b"5"
    other.close()
    # Times to live, for keys on both shards (every other one is forwarded).
    for i in range(20):
        k = f"pttl{i}"
        assert r.set(k, "v", ex=100) is True
        assert r.ttl(k) == 100
        assert 99_000 <= r.pttl(k) <= 100_000
        assert r.expire(k, 50, gt=True) is False and r.expire(k, 50, lt=True) is True
        assert r.persist(k) is True and r.ttl(k) == -1
        assert r.setex(k, 10, "w") is True and r.ttl(k) == 10
        assert r.getex(k, persist=True) == b"w" and r.ttl(k) == -1
        assert r.pexpire(k, 60_000, nx=True) is True and r.expiretime(k) > 0
        assert r.set(k, "x", keepttl=True) is True and r.ttl(k) == 60
    assert r.ttl("pttl-missing") == -2
    assert r.set("pshort", "v", px=100) is True
    time.sleep(0.25)
    assert r.get("pshort") is None and r.exists("pshort") == 0
    # The keyspace, across both shards through this node.
    listed = set(r.scan_iter(match="py1*", count=7))
    assert listed == {f"py{i}".encode() for i in range(200) if str(i).startswith("1")}, listed
    assert set(r.keys("py19?")) == {f"py19{i}".encode() for i in range(10)}
    assert r.dbsize() >= 200 and r.randomkey() is not None
    assert r.type("py1") == b"string" and r.object("encoding", "pcount") == b"int"
    assert r.memory_usage("py1") > 0 and r.exists("py1", "py2") == 2
    assert r.unlink("py1") == 1 and r.touch("py2") == 1
    for i in range(64):  # RENAME within a shard (CROSSSLOT across: the target is found by trying)
        try:
            assert r.rename("py2", f"pyr{i}") is True
            assert r.get(f"pyr{i}") == b"v2" and r.get("py2") is None
            break
        except redis.exceptions.ResponseError as e:
            assert "same slot" in str(e), e
    else:
        raise AssertionError("no rename target on py2's shard")
    # The unknown type commands get Redis's error, and the connection goes on.
    try:
        r.lpush("list", "a")
        raise AssertionError("LPUSH answered")
    except redis.exceptions.ResponseError as e:
        assert "unknown command" in str(e), e
    assert r.ping() is True
    r.close()


async def check_async(host, port, password):
    r = redis.asyncio.Redis(host=host, port=port, password=password)
    assert await r.ping() is True
    await r.set("apy", "v")
    assert await r.get("apy") == b"v"
    assert await r.get("apy-missing") is None
    assert "apy".encode() in [k async for k in r.scan_iter(match="apy")]
    await r.aclose()


def main():
    addr = sys.argv[1]
    password = sys.argv[2] if len(sys.argv) > 2 else None
    host, port = addr.rsplit(":", 1)
    check_sync(host, int(port), password)
    asyncio.run(check_async(host, int(port), password))
    if password:
        try:
            redis.Redis(host=host, port=int(port), password="wrong").ping()
            raise AssertionError("a wrong token was accepted")
        except redis.exceptions.AuthenticationError:
            pass
    print(f"redis-py {redis.__version__}: every check passed")


main()
