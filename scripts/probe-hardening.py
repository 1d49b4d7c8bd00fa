#!/usr/bin/env python3
"""Runs the hardening probes (issue 11) against one kvd build and prints, per probe, the
node's peak RSS and how long a healthy client's `kvd put` took while the probe ran.

Usage: scripts/probe-hardening.py BIN_DIR [PORT]

BIN_DIR holds kvd (e.g. target/release, or an older build to compare with). Every probe
starts its own kvd on 127.0.0.1:PORT (default 17950) and stops it by PID afterwards.
Stdlib only. The probes:

  announce   60 connections each announce a 64 MiB body and send 1,000 bytes of it
  bodies     64 connections each send 60 MiB of a 64 MiB body and stall
  idle       1,024 idle connections, then a healthy client (is it told, or parked?)
  badframes  80,000 malformed frames; also reports the bytes kvd wrote to its log
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release"
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 17950
ADDR = ("127.0.0.1", PORT)
KVD = os.path.join(BIN, "kvd")


def header(length, kind=1, version=None, ident=1):
    """A frame header; the version byte is read from a real frame of this build."""
    return b"KV" + bytes([version, kind]) + struct.pack("<IQ", length, ident)


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Node:
    def __init__(self, *args):
        self.log = open(f"/tmp/probe-kvd-{PORT}.log", "wb")
        self.proc = subprocess.Popen([KVD, "--listen", f"127.0.0.1:{PORT}", *args], stderr=self.log)
        for _ in range(100):
            try:
                socket.create_connection(ADDR, timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.peak = rss(self.proc.pid)
        self.stop_watch = False
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.watcher.start()

    def watch(self):
        while not self.stop_watch:
            self.peak = max(self.peak, rss(self.proc.pid))
            time.sleep(0.02)

    def healthy_put(self):
        start = time.time()
        out = subprocess.run([KVD, "put", "--nodes", f"127.0.0.1:{PORT}", "--timeout", "10s", "k", "v"],
                             capture_output=True, text=True)
        took = time.time() - start
        return took, out.returncode, out.stderr.strip().splitlines()[-1:] if out.returncode else []

    def stop(self):
        self.stop_watch = True
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return os.path.getsize(self.log.name)


def version_byte():
    """Asks the build's own client for a frame and reads its version byte."""
    node = Node()
    got = {}
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", PORT + 1))
    srv.listen(1)

    def grab():
        c, _ = srv.accept()
        got["v"] = c.recv(16)[2]
        c.close()

    t = threading.Thread(target=grab, daemon=True)
    t.start()
    subprocess.run([KVD, "get", "--nodes", f"127.0.0.1:{PORT + 1}", "--timeout", "1s", "x"], capture_output=True)
    t.join(2)
    srv.close()
    node.stop()
    return got.get("v", 3)


def report(name, node, took, code, err, extra=""):
    log = node.stop()
    mb = node.peak / (1 << 20)
    status = "served" if code == 0 else f"refused ({' '.join(err)[:70]})"
    print(f"{name:<10} peak RSS {mb:8.0f} MB   healthy put {took * 1000:7.0f} ms, {status}{extra}"
          + (f"   log {log / 1e6:.1f} MB" if name == "badframes" else ""))


def announce(v):
    node = Node()
    conns = []
    for _ in range(60):
        s = socket.create_connection(ADDR)
        s.sendall(header(64 << 20, version=v) + b"\0" * 1000)
        conns.append(s)
    time.sleep(0.5)
    took, code, err = node.healthy_put()
    time.sleep(0.5)
    report("announce", node, took, code, err)
    for s in conns:
        s.close()


def bodies(v):
    node = Node()
    chunk = b"\1" * (1 << 20)

    def attack():
        try:
            s = socket.create_connection(ADDR)
            s.settimeout(2)
            s.sendall(header(64 << 20, version=v))
            for _ in range(60):
                s.sendall(chunk)
            time.sleep(3)
            s.close()
        except OSError:
            pass

    threads = [threading.Thread(target=attack) for _ in range(64)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    took, code, err = node.healthy_put()
    for t in threads:
        t.join()
    report("bodies", node, took, code, err)


def idle(v):
    node = Node("--idle-timeout", "3s")
    conns = [socket.create_connection(ADDR) for _ in range(1024)]
    time.sleep(0.3)
    took, code, err = node.healthy_put()
    report("idle", node, took, code, err)
    for s in conns:
        s.close()


def badframes(v):
    node = Node()
    frames = (header(64, version=v, ident=9) + b"\xa5" * 64) * 100

    def attack():
        s = socket.create_connection(ADDR)
        s.settimeout(10)
        for _ in range(200):
            s.sendall(frames)
            want = 0
            # Read whatever replies come; the count does not matter here.
            try:
                while want < 1:
                    if not s.recv(1 << 16):
                        break
                    want += 1
            except OSError:
                break
        s.close()

    threads = [threading.Thread(target=attack) for _ in range(4)]
    for t in threads:
        t.start()
    took, code, err = node.healthy_put()
    for t in threads:
        t.join()
    report("badframes", node, took, code, err)


if __name__ == "__main__":
    v = version_byte()
    print(f"kvd from {BIN} (protocol version {v})")
    for probe in (announce, bodies, idle, badframes):
        probe(v)
