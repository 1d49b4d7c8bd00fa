"""redis-py's RedisCluster against a kvd cluster started with --resp-cluster, given one
node: it learns the slots (CLUSTER SLOTS, COMMAND for where keys are) and sends each command
to its slot's master itself. Run by kvd/tests/redis_cluster.rs: ADDR [TOKEN] [--replicas].
Exits 1 at the first difference from Redis Cluster."""

import os
import sys

from redis.cluster import ClusterNode, RedisCluster


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    rest = sys.argv[2:]
    replicas = "--replicas" in rest
    rest = [a for a in rest if a != "--replicas"]
    token = rest[0] if rest else None
    extra = {}
    if replicas:
        from redis.cluster import LoadBalancingStrategy

        extra["load_balancing_strategy"] = LoadBalancingStrategy.ROUND_ROBIN_REPLICAS
    rc = RedisCluster(startup_nodes=[ClusterNode(host, int(port))], password=token, decode_responses=True, **extra)
    r = f"{os.getpid()}-"
    masters = rc.get_primaries()
    assert len(masters) >= 1, masters
    for i in range(300):
        assert rc.set(f"pc-{r}{i}", f"v{i}")
    for i in range(300):
        got = rc.get(f"pc-{r}{i}")
        assert got == f"v{i}", (i, got)
    assert rc.get(f"pc-{r}missing") is None
    assert rc.mget_nonatomic([f"pc-{r}{i}" for i in range(20)]) == [f"v{i}" for i in range(20)]
    assert rc.mset({f"{{pc{r}}}a": "1", f"{{pc{r}}}b": "2"})
    assert rc.mget(f"{{pc{r}}}a", f"{{pc{r}}}b") == ["1", "2"]
    assert rc.incr(f"{{pc{r}}}n") == 1
    assert rc.delete(f"{{pc{r}}}a", f"{{pc{r}}}b") == 2
    pipe = rc.pipeline()
    for i in range(100):
        pipe.incr(f"pc-{r}count-{i}")
    assert pipe.execute() == [1] * 100
    slot = rc.keyslot(f"pc-{r}7")
    assert rc.cluster_countkeysinslot(slot) >= 1
    keys = rc.cluster_get_keys_in_slot(slot, 10)
    assert f"pc-{r}7" in keys, keys
    # DBSIZE goes to one node unless told otherwise (redis-py's choice, as with Redis).
    total = rc.dbsize(target_nodes=RedisCluster.PRIMARIES)
    assert total >= 300 + 100 + 1, total
    assert sum(1 for _ in rc.scan_iter(match=f"pc-{r}*", count=100)) >= 400
    print(f"redis-py RedisCluster: {len(masters)} masters, {total} keys")
    print("redis-py RedisCluster: every check passed")


if __name__ == "__main__":
    main()
