// go-redis v9 against kvd with Protocol: 3 (RESP3 via HELLO 3) and with its default, on a
// 2-shard cluster through one node: run by kvd/tests/redis_clients.rs with the RESP
// address and, optionally, the token. Exits 1 at the first difference from Redis.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func check(ok bool, format string, args ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, password string, protocol int) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: protocol})
	defer rdb.Close()
	check(rdb.Ping(ctx).Val() == "PONG", "ping (protocol %d)", protocol)
	prefix := fmt.Sprintf("go%d-", protocol)
	for i := 0; i < 200; i++ {
		check(rdb.Set(ctx, fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("v%d", i), 0).Err() == nil, "set %d", i)
	}
	for i := 0; i < 200; i++ {
		v, err := rdb.Get(ctx, fmt.Sprintf("%s%d", prefix, i)).Result()
		check(err == nil && v == fmt.Sprintf("v%d", i), "get %d: %q %v", i, v, err)
	}
	_, err := rdb.Get(ctx, prefix+"missing").Result()
	check(errors.Is(err, redis.Nil), "a missing key is redis.Nil: %v", err)
	vals, err := rdb.MGet(ctx, prefix+"1", prefix+"missing").Result()
	check(err == nil && len(vals) == 2 && vals[0] == "v1" && vals[1] == nil, "mget: %v %v", vals, err)
	check(rdb.MSet(ctx, prefix+"a", "1", prefix+"b", "2").Err() == nil, "mset")
	n, err := rdb.Exists(ctx, prefix+"a", prefix+"b", prefix+"missing").Result()
	check(err == nil && n == 2, "exists: %d %v", n, err)
	ok, err := rdb.SetNX(ctx, prefix+"a", "x", 0).Result()
	check(err == nil && !ok, "setnx on a present key: %v %v", ok, err)
	c, err := rdb.IncrBy(ctx, prefix+"count", 5).Result()
	check(err == nil && c == 5, "incrby: %d %v", c, err)
	c, err = rdb.Decr(ctx, prefix+"count").Result()
	check(err == nil && c == 4, "decr: %d %v", c, err)
	_, err = rdb.Incr(ctx, prefix+"a").Result()
	check(err == nil, "incr of an integer value: %v", err)
	_, err = rdb.Incr(ctx, prefix+"p-text").Result()
	check(err == nil, "incr of an absent key: %v", err)
	check(rdb.Set(ctx, prefix+"text", "x", 0).Err() == nil, "set text")
	_, err = rdb.Incr(ctx, prefix+"text").Result()
	check(err != nil && strings.Contains(err.Error(), "not an integer"), "incr of text: %v", err)
	d, err := rdb.Del(ctx, prefix+"a", prefix+"b").Result()
	check(err == nil && d == 2, "del: %d %v", d, err)
	// String ops and the other counters.
	s := prefix + "s"
	check(rdb.Set(ctx, s, "Hello", 0).Err() == nil, "set s")
	n2, err := rdb.Append(ctx, s, " World").Result()
	check(err == nil && n2 == 11, "append: %d %v", n2, err)
	n2, err = rdb.StrLen(ctx, s).Result()
	check(err == nil && n2 == 11, "strlen: %d %v", n2, err)
	gr, err := rdb.GetRange(ctx, s, -5, -1).Result()
	check(err == nil && gr == "World", "getrange: %q %v", gr, err)
	n2, err = rdb.SetRange(ctx, s, 6, "Redis").Result()
	check(err == nil && n2 == 11, "setrange: %d %v", n2, err)
	gd, err := rdb.GetDel(ctx, s).Result()
	check(err == nil && gd == "Hello Redis", "getdel: %q %v", gd, err)
	f, err := rdb.IncrByFloat(ctx, prefix+"f", 10.5).Result()
	check(err == nil && f == 10.5, "incrbyfloat: %v %v", f, err)
	c, err = rdb.DecrBy(ctx, prefix+"count", 3).Result()
	check(err == nil && c == 1, "decrby: %d %v", c, err)
	ty, err := rdb.Type(ctx, prefix+"count").Result()
	check(err == nil && ty == "string", "type: %q %v", ty, err)
	n2, err = rdb.Touch(ctx, prefix+"count", prefix+"missing").Result()
	check(err == nil && n2 == 1, "touch: %d %v", n2, err)
	n2, err = rdb.Unlink(ctx, prefix+"f").Result()
	check(err == nil && n2 == 1, "unlink: %d %v", n2, err)
	pipe := rdb.Pipeline()
	pipe.Set(ctx, prefix+"p", "x", 0)
	get := pipe.Get(ctx, prefix+"p")
	_, err = pipe.Exec(ctx)
	check(err == nil && get.Val() == "x", "pipeline: %v %q", err, get.Val())
	// A transaction on one key runs whole; a watched key changed by another client makes
	// it fail with redis.TxFailedErr and run nothing.
	cmds, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, prefix+"tx", "1", 0)
		p.Incr(ctx, prefix+"tx")
		return nil
	})
	check(err == nil && len(cmds) == 2, "a MULTI/EXEC transaction: %v", err)
	v, err := rdb.Get(ctx, prefix+"tx").Result()
	check(err == nil && v == "2", "after the transaction: %q %v", v, err)
	err = rdb.Watch(ctx, func(tx *redis.Tx) error {
		check(rdb.Set(ctx, prefix+"tx", "changed", 0).Err() == nil, "set by another client")
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, prefix+"tx", "mine", 0)
			return nil
		})
		return err
	}, prefix+"tx")
	check(errors.Is(err, redis.TxFailedErr), "a transaction on a changed watched key: %v", err)
	v, err = rdb.Get(ctx, prefix+"tx").Result()
	check(err == nil && v == "changed", "the watched key: %q %v", v, err)
	// Times to live.
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("%sttl%d", prefix, i)
		check(rdb.Set(ctx, k, "v", 100*time.Second).Err() == nil, "set with a ttl")
		ttl, err := rdb.TTL(ctx, k).Result()
		check(err == nil && ttl == 100*time.Second, "ttl: %v %v", ttl, err)
		set, err := rdb.ExpireLT(ctx, k, 50*time.Second).Result()
		check(err == nil && set, "expire lt: %v %v", set, err)
		set, err = rdb.ExpireGT(ctx, k, 10*time.Second).Result()
		check(err == nil && !set, "expire gt: %v %v", set, err)
		set, err = rdb.Persist(ctx, k).Result()
		check(err == nil && set, "persist: %v %v", set, err)
		ttl, err = rdb.TTL(ctx, k).Result()
		check(err == nil && ttl == -1, "ttl after persist: %v %v", ttl, err)
		v, err := rdb.GetEx(ctx, k, 30*time.Second).Result()
		check(err == nil && v == "v", "getex: %q %v", v, err)
		pttl, err := rdb.PTTL(ctx, k).Result()
		check(err == nil && pttl > 29*time.Second && pttl <= 30*time.Second, "pttl: %v %v", pttl, err)
	}
	ttl, err := rdb.TTL(ctx, prefix+"ttl-missing").Result()
	check(err == nil && ttl == -2, "ttl of a missing key: %v %v", ttl, err)
	check(rdb.Set(ctx, prefix+"short", "v", 100*time.Millisecond).Err() == nil, "set px")
	time.Sleep(250 * time.Millisecond)
	_, err = rdb.Get(ctx, prefix+"short").Result()
	check(errors.Is(err, redis.Nil), "a key read after its deadline: %v", err)
	info, err := rdb.Info(ctx, "replication").Result()
	check(err == nil && strings.Contains(info, "role:master"), "info replication: %v", err)
	// The keyspace across both shards through this node: SCAN with MATCH, KEYS, DBSIZE.
	seen := map[string]int{}
	iter := rdb.Scan(ctx, 0, prefix+"1*", 7).Iterator()
	for iter.Next(ctx) {
		seen[iter.Val()]++
	}
	check(iter.Err() == nil && len(seen) == 111, "scan: %d keys, %v", len(seen), iter.Err())
	keys, err := rdb.Keys(ctx, prefix+"19?").Result()
	check(err == nil && len(keys) == 10, "keys: %v %v", keys, err)
	size, err := rdb.DBSize(ctx).Result()
	check(err == nil && size >= 200, "dbsize: %d %v", size, err)
	enc, err := rdb.ObjectEncoding(ctx, prefix+"count").Result()
	check(err == nil && enc == "int", "object encoding: %q %v", enc, err)
	usage, err := rdb.MemoryUsage(ctx, prefix+"1").Result()
	check(err == nil && usage > 0, "memory usage: %d %v", usage, err)
}

// runCluster: go-redis's ClusterClient against a kvd cluster started with --resp-cluster,
// given one node: it learns the slots (CLUSTER SLOTS) and sends each command to its
// slot's master itself.
func runCluster(ctx context.Context, addr, password string, readOnly bool) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, Password: password, ReadOnly: readOnly})
	defer rdb.Close()
	for i := 0; i < 300; i++ {
		check(rdb.Set(ctx, fmt.Sprintf("gc-%d", i), fmt.Sprintf("v%d", i), 0).Err() == nil, "cluster set %d", i)
	}
	for i := 0; i < 300; i++ {
		v, err := rdb.Get(ctx, fmt.Sprintf("gc-%d", i)).Result()
		check(err == nil && v == fmt.Sprintf("v%d", i), "cluster get %d: %q %v", i, v, err)
	}
	pipe := rdb.Pipeline()
	for i := 0; i < 100; i++ {
		pipe.Incr(ctx, fmt.Sprintf("gc-count-%d", i))
	}
	cmds, err := pipe.Exec(ctx)
	check(err == nil && len(cmds) == 100, "cluster pipeline: %v", err)
	check(rdb.MSet(ctx, "{gc}a", "1", "{gc}b", "2").Err() == nil, "mset of one slot")
	vals, err := rdb.MGet(ctx, "{gc}a", "{gc}b").Result()
	check(err == nil && len(vals) == 2 && vals[0] == "1" && vals[1] == "2", "mget of one slot: %v %v", vals, err)
	masters := 0
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		masters++
		return c.Ping(ctx).Err()
	})
	check(err == nil && masters >= 1, "every master answers: %d %v", masters, err)
	fmt.Printf("go-redis ClusterClient: %d masters\n", masters)
}

func main() {
	ctx := context.Background()
	if len(os.Args) > 2 && (os.Args[1] == "cluster" || os.Args[1] == "cluster-readonly") {
		password := ""
		if len(os.Args) > 3 {
			password = os.Args[3]
		}
		runCluster(ctx, os.Args[2], password, os.Args[1] == "cluster-readonly")
		fmt.Println("go-redis v9 ClusterClient: every check passed")
		return
	}
	addr := os.Args[1]
	password := ""
	if len(os.Args) > 2 {
		password = os.Args[2]
	}
	run(ctx, addr, password, 3)
	run(ctx, addr, password, 2)
	if password != "" {
		bad := redis.NewClient(&redis.Options{Addr: addr, Password: "wrong", Protocol: 3})
		check(bad.Ping(ctx).Err() != nil, "a wrong token was accepted")
		bad.Close()
	}
	fmt.Println("go-redis v9: every check passed")
}
