"""The Python client library (clients/python, import name `holdfast`) against real daemons: one
node for every primitive, leases, losses, TLS and the token; a three-node cluster for a failover
under a lease and an election across three processes; the package itself (generated code,
installation, the README's examples).

`make test-clients` installs the package into the tests' venv (`make deps-python`)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import holdfast
from conftest import start_holdfast, stop_holdfast
from test_dlock_proto import compile_proto, recv_exact
from test_prometheus import Node, free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PACKAGE = os.path.join(ROOT, "clients", "python")
README = os.path.join(PACKAGE, "README.md")

DLOCK_ONLY = ["--dlock", "127.0.0.1:0", "--memcache", "off", "--lockd", "off", "--counter", "off",
              "--admin", "off", "--threads", "2"]
# Bounds of the waits below: a correct client and daemon take milliseconds.
SOON_S = 5
CLUSTER_START_S = 20


def dlock_addr(daemon):
    host, port = daemon.addresses["dlock"]
    return f"{host}:{port}"


@pytest.fixture
def daemon():
    d = start_holdfast(base=DLOCK_ONLY, want=("dlock",))
    yield d
    stop_holdfast(d.proc)


@pytest.fixture
def client(daemon):
    c = holdfast.Client([dlock_addr(daemon)])
    yield c
    c.close()


@pytest.fixture(scope="module")
def raw_pb(tmp_path_factory):
    """Messages generated from proto/holdfast.proto by the test itself (another package name):
    a raw client independent of the library's own code."""
    with open(os.path.join(ROOT, "proto", "holdfast.proto")) as f:
        text = f.read().replace("package dlock;", "package pyclient_raw;")
    return compile_proto(text, str(tmp_path_factory.mktemp("raw")), "pyclient_raw")


class Raw:
    """A native-protocol connection framed by hand."""

    def __init__(self, pb, addr):
        host, port = addr.rsplit(":", 1)
        self.pb = pb
        self.sock = socket.create_connection((host, int(port)), timeout=SOON_S)
        self.next_id = 1

    def call(self, type_, **lock):
        req = self.pb.Request(version=3, id=self.next_id, type=self.pb.RequestType.Value(type_))
        self.next_id += 1
        if lock:
            req.lock.CopyFrom(self.pb.RequestLock(**lock))
        body = req.SerializeToString()
        self.sock.sendall(len(body).to_bytes(4, "big") + body)
        while True:
            resp = self.read()
            if resp.request_id == req.id and not resp.HasField("event"):
                return resp

    def read(self):
        n = int.from_bytes(recv_exact(self.sock, 4), "big")
        return self.pb.Response.FromString(recv_exact(self.sock, n))

    def close(self):
        self.sock.close()


def wait_for(what, within, probe):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.02)
    pytest.fail(f"{what}: not within {within} s")


# Every primitive against one daemon.

def test_an_exclusive_lock_has_a_fence_shown_by_get_and_check_fence(client):
    with client.lock("job", value=b"host-a") as held:
        assert isinstance(held.fence, int) and held.fence > 0
        assert isinstance(held.lost, threading.Event) and not held.lost.is_set()
        info = client.get("job")
        assert isinstance(info, holdfast.KeyInfo)
        assert [(h.fence, h.value, h.lease_left) for h in info.holders] == \
            [(held.fence, b"host-a", None)]
        assert info.waiters == 0 and info.limit == 1 and not info.shared
        assert client.check_fence("job", held.fence) is True
        assert client.check_fence("job", held.fence + 1) is False
        assert "fence=" in repr(held) and "held" in repr(held)
    assert client.get("job").holders == ()
    assert client.check_fence("job", held.fence) is False
    assert "released" in repr(held)
    with client.lock("job") as again:
        assert again.fence > held.fence


def test_wait_zero_tries_once_and_a_wait_times_out(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        with client.lock("busy"):
            t0 = time.monotonic()
            with pytest.raises(holdfast.AcquireTimeout):
                other.lock("busy", wait=0)
            assert time.monotonic() - t0 < 1
            t0 = time.monotonic()
            with pytest.raises(holdfast.AcquireTimeout):
                other.lock("busy", wait=0.3)
            took = time.monotonic() - t0
            assert 0.29 <= took < 3, took
            assert client.get("busy").waiters == 0
    finally:
        other.close()


def test_a_waiting_lock_is_granted_when_the_holder_leaves(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    got = []
    try:
        first = client.lock("queue")
        t = threading.Thread(target=lambda: got.append(other.lock("queue", wait=SOON_S)))
        t.start()
        wait_for("a waiter", SOON_S, lambda: client.get("queue").waiters == 1)
        first.release()
        t.join(SOON_S)
        assert got and got[0].fence > first.fence
        got[0].release()
    finally:
        other.close()


def test_a_lease_granted_after_a_long_wait_is_kept(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    got = []
    try:
        first = client.lock("late")
        t = threading.Thread(target=lambda: got.append(other.lock("late", lease=0.3)))
        t.start()
        time.sleep(1.0)  # three lease lengths of waiting
        first.release()
        t.join(SOON_S)
        time.sleep(1.0)
        assert not got[0].lost.is_set(), got[0].lost_reason
        assert client.get("late").holders[0].fence == got[0].fence
        got[0].release()
    finally:
        other.close()


def test_shared_holders_coexist_and_exclude_a_writer(client):
    with client.lock("cache", shared=True) as a, client.lock("cache", shared=True) as b:
        assert a.fence != b.fence
        info = client.get("cache")
        assert info.shared and sorted(h.fence for h in info.holders) == sorted([a.fence, b.fence])
        with pytest.raises(holdfast.AcquireTimeout):
            client.lock("cache", wait=0)
    with client.lock("cache", wait=0):
        with pytest.raises(holdfast.AcquireTimeout):
            client.lock("cache", shared=True, wait=0)


def test_a_semaphore_admits_its_limit(client):
    with client.lock("pool", limit=2, value="w1") as a, client.lock("pool", limit=2, value=b"w2") as b:
        assert a.fence != b.fence
        with pytest.raises(holdfast.AcquireTimeout):
            client.lock("pool", limit=2, wait=0)
        with pytest.raises(holdfast.RequestError) as e:
            client.lock("pool", limit=3, wait=0)
        assert e.value.status == "InvalidArgument"
        info = client.get("pool")
        assert info.limit == 2 and [h.value for h in info.holders] == [b"w1", b"w2"]
    with pytest.raises(holdfast.RequestError) as e:
        client.lock("pool", shared=True, limit=2)
    assert e.value.status == "InvalidArgument"


def test_a_value_over_4096_bytes_is_refused(client):
    with pytest.raises(holdfast.RequestError) as e:
        client.lock("big", value=b"x" * 4097)
    assert e.value.status == "InvalidArgument"
    with client.lock("big", value=b"x" * 4096):
        assert client.get("big").holders[0].value == b"x" * 4096


def test_lock_delay_keeps_the_key_after_a_loss(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        held = other.lock("delayed", lock_delay=1.0)
        other._conn.fail("the test breaks the connection")  # a crash, as the server sees it
        assert held.lost.wait(SOON_S)
        wait_for("the hold to end", SOON_S, lambda: client.get("delayed").holders == ())
        info = client.get("delayed")
        assert 0 < info.delayed <= 1.0
        with pytest.raises(holdfast.AcquireTimeout):
            client.lock("delayed", wait=0)
        t0 = time.monotonic()
        with client.lock("delayed", wait=SOON_S):
            assert time.monotonic() - t0 < 1.5
    finally:
        other.close()


def test_an_unlock_starts_no_lock_delay(client):
    with client.lock("clean", lock_delay=5.0, lease=2.0):
        pass
    with client.lock("clean", wait=0):
        pass


def test_a_lease_outlives_its_connection_and_a_plain_lock_does_not(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        lease = other.lock("leased", lease=1.0)
        plain = other.lock("plain")
        other._conn.fail("the test breaks the connection")
        assert plain.lost.wait(SOON_S)
        info = client.get("leased")
        assert [h.fence for h in info.holders] == [lease.fence]
        # The keeper moved it to a new connection and keeps renewing it.
        time.sleep(2.5)
        assert not lease.lost.is_set()
        assert client.check_fence("leased", lease.fence)
        lease.release()
        assert client.get("leased").holders == ()
    finally:
        other.close()


@pytest.mark.parametrize("lease", [0.3, 1.0, 2.0])
def test_a_lease_is_renewed_for_three_lengths(client, daemon, lease):
    watcher = holdfast.Client([dlock_addr(daemon)])
    try:
        with client.lock(f"renewed/{lease}", lease=lease) as held:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3 * lease:
                info = watcher.get(f"renewed/{lease}")
                assert [h.fence for h in info.holders] == [held.fence], "the lease ran out"
                assert 0 < info.holders[0].lease_left <= lease + 0.01
                time.sleep(lease / 10)
            assert not held.lost.is_set()
        assert watcher.get(f"renewed/{lease}").holders == ()
    finally:
        watcher.close()


def test_lost_is_set_when_another_client_unlocks_by_fence(client, daemon, raw_pb):
    raw = Raw(raw_pb, dlock_addr(daemon))
    try:
        for lease in (None, 5.0):
            t0 = time.monotonic()
            with client.lock("taken", lease=lease) as held:
                resp = raw.call("Unlock", keys=["taken"], fence=held.fence)
                assert resp.status == raw_pb.Ok
                assert held.lost.wait(SOON_S)
                assert "lost" in repr(held)
            assert time.monotonic() - t0 < SOON_S  # leaving after the loss did not hang
            assert not client.check_fence("taken", held.fence)
    finally:
        raw.close()


def test_a_loss_notice_right_behind_the_grant_is_not_missed(client, daemon, raw_pb):
    """The raw client releases its hold and, in the same write, unlocks the next grant (the
    waiting client's, fence + 1) by fence: the grant's answer and the loss notice arrive
    together."""
    raw = Raw(raw_pb, dlock_addr(daemon))
    try:
        first = raw.call("Lock", keys=["race"])
        got = []
        t = threading.Thread(target=lambda: got.append(client.lock("race")))
        t.start()
        wait_for("the client waits", SOON_S, lambda: client.get("race").waiters == 1)
        frames = b""
        for rid, lock in ((100, raw_pb.RequestLock(keys=["race"])),
                          (101, raw_pb.RequestLock(keys=["race"], fence=first.fence + 1))):
            body = raw_pb.Request(version=3, id=rid, type=raw_pb.Unlock, lock=lock).SerializeToString()
            frames += len(body).to_bytes(4, "big") + body
        raw.sock.sendall(frames)
        answers = {r.request_id: r.status for r in (raw.read(), raw.read())}
        assert answers == {100: raw_pb.Ok, 101: raw_pb.Ok}, answers
        t.join(SOON_S)
        assert got and got[0].fence == first.fence + 1
        assert got[0].lost.wait(SOON_S), "the loss notice was missed"
        got[0].release()
    finally:
        raw.close()


def test_unlock_by_fence_through_the_library(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        with client.lock("stuck", lease=5.0) as held:
            assert other.unlock("stuck", held.fence) is True
            assert held.lost.wait(SOON_S)
            assert other.unlock("stuck", held.fence) is False
    finally:
        other.close()


def test_lost_is_set_before_the_lease_ends_when_every_server_is_gone():
    d = start_holdfast(base=DLOCK_ONLY, want=("dlock",))
    c = holdfast.Client([dlock_addr(d)])
    try:
        lease = c.lock("gone/lease", lease=1.0)
        plain = c.lock("gone/plain")
        time.sleep(0.5)  # a renewal or two
        stop_holdfast(d.proc)
        stopped = time.monotonic()
        assert plain.lost.wait(SOON_S)
        # The latest the server's lease can end: the last renewal it answered, plus the lease.
        ends = lease.expires
        assert ends <= stopped + 1.0 + 0.01
        assert lease.lost.wait(SOON_S)
        lost_at = time.monotonic()
        assert lost_at < ends, (lost_at, ends)
        assert "could not be renewed" in lease.lost_reason
        t0 = time.monotonic()
        lease.release()
        plain.release()
        assert time.monotonic() - t0 < 1
        with pytest.raises(holdfast.ConnectionLost):
            c.get("gone/lease")
    finally:
        c.close()
        stop_holdfast(d.proc)


def test_a_lease_is_lost_in_time_while_the_client_waits_between_rounds_of_reconnects():
    # With no server answering, the keeper waits between rounds over the servers; that wait
    # must end for a lease's deadline, however long the pause between rounds.
    d = start_holdfast(base=DLOCK_ONLY, want=("dlock",))
    c = holdfast.Client([dlock_addr(d)])
    c.reconnect_delay = 5.0
    try:
        lease = c.lock("gone/slow-rounds", lease=1.0)
        stop_holdfast(d.proc)
        assert lease.lost.wait(SOON_S)
        lost_at = time.monotonic()
        assert lost_at < lease.expires, (lost_at, lease.expires)
        assert "could not be renewed" in lease.lost_reason
    finally:
        c.close()
        stop_holdfast(d.proc)


def test_two_threads_of_one_client_never_both_hold_an_exclusive_lock(client):
    inside = [0]
    seen = []
    errors = []

    def work():
        try:
            for _ in range(100):
                with client.lock("mutex", lease=5.0) as held:
                    inside[0] += 1
                    seen.append((inside[0], held.fence))
                    time.sleep(0.0005)
                    inside[0] -= 1
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(seen) == 800
    assert max(n for n, _ in seen) == 1
    assert len({f for _, f in seen}) == 800


def test_watch_sees_every_kind_of_event(client, daemon, raw_pb):
    with client.watch("watched") as w:
        assert w.info is not None and w.info.holders == ()
        second = client.watch("watched")  # a second watcher of the same key in one client
        with client.lock("watched", value=b"a") as held:
            pass
        assert w.next(SOON_S) == holdfast.Event("watched", "acquired", held.fence, b"a")
        assert w.next(SOON_S) == holdfast.Event("watched", "released", held.fence, b"a")
        assert second.next(SOON_S).kind == "acquired"
        assert second.next(SOON_S).kind == "released"
        second.close()
        with pytest.raises(StopIteration):
            next(second)
        raw = Raw(raw_pb, dlock_addr(daemon))
        resp = raw.call("Lock", keys=["watched"], release_micro=100_000, value=b"r")
        assert w.next(SOON_S).kind == "acquired"
        ev = w.next(SOON_S)
        assert (ev.kind, ev.fence, ev.value) == ("expired", resp.fence, b"r")
        resp = raw.call("Lock", keys=["watched"])
        assert w.next(SOON_S).kind == "acquired"
        raw.close()
        ev = w.next(SOON_S)
        assert (ev.kind, ev.fence) == ("lost", resp.fence)
        assert w.next(0.2) is None
        events = []
        t = threading.Thread(target=lambda: events.extend(w))
        t.start()
        w.close()
        t.join(SOON_S)
        assert not t.is_alive() and events == []


def test_a_broken_connection_ends_a_watch_and_observe_watches_again(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        w = client.watch("broken")
        e = holdfast.Election(client, "broken", value="x")
        obs = e.observe()
        assert next(obs) is None
        client._conn.fail("the test breaks the connection")
        with pytest.raises(holdfast.ConnectionLost):
            next(w)
        term = holdfast.Election(other, "broken", value="y").campaign()
        # observe watched again through a new connection and says who leads now
        assert next(obs) == holdfast.Leader(term.fence, b"y")
        term.release()
        assert next(obs) is None
        obs.close()
    finally:
        other.close()


def test_an_election(client, daemon):
    other = holdfast.Client([dlock_addr(daemon)])
    try:
        a = holdfast.Election(client, "election/x", value="a", lease=2.0)
        b = holdfast.Election(other, "election/x", value=b"b", lease=2.0)
        observed = []
        obs = b.observe()
        observed.append(next(obs))
        assert observed == [None] and a.leader() is None
        term = a.campaign()
        assert a.leading and a.leader() == holdfast.Leader(term.fence, b"a")
        assert next(obs) == holdfast.Leader(term.fence, b"a")
        with pytest.raises(holdfast.AcquireTimeout):
            b.campaign(wait=0.1)
        got = []
        t = threading.Thread(target=lambda: got.append(b.campaign(wait=SOON_S)))
        t.start()
        wait_for("b waits", SOON_S, lambda: client.get("election/x").waiters == 1)
        a.resign()
        t.join(SOON_S)
        assert not a.leading and b.leading and got[0].fence > term.fence
        assert next(obs) is None  # released
        assert next(obs) == holdfast.Leader(got[0].fence, b"b")
        obs.close()
        b.resign()
        assert a.leader() is None
    finally:
        other.close()


def test_close_releases_and_ends_watches(daemon):
    c = holdfast.Client([dlock_addr(daemon)])
    check = holdfast.Client([dlock_addr(daemon)])
    try:
        held = c.lock("closing", lease=30.0)
        w = c.watch("other")
        c.close()
        assert check.get("closing").holders == ()
        with pytest.raises(StopIteration):
            next(w)
        assert "closed" in repr(c)
        held.release()  # after close: nothing to do, no hang
    finally:
        check.close()


def test_the_access_token(tmp_path):
    d = start_holdfast("--dlock-token", "s3cret", base=DLOCK_ONLY, want=("dlock",))
    try:
        with holdfast.Client([dlock_addr(d)], token="s3cret") as c:
            with c.lock("t", lease=1.0) as held:
                time.sleep(0.5)  # renewals carry the token too
                assert c.check_fence("t", held.fence)
        with holdfast.Client([dlock_addr(d)], token="wrong") as c:
            with pytest.raises(holdfast.RequestError) as e:
                c.lock("t")
            assert e.value.status == "General" and "access denied" in e.value.text
        with holdfast.Client([dlock_addr(d)]) as c:
            with pytest.raises(holdfast.RequestError):
                c.get("t")
    finally:
        stop_holdfast(d.proc)


def test_tls_through_an_ssl_context(tmp_path):
    trustme = pytest.importorskip("trustme")
    import ssl
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    for i, pem in enumerate(server.cert_chain_pems):
        pem.write_to_path(str(cert), append=i > 0)
    server.private_key_pem.write_to_path(str(key))
    os.chmod(key, 0o600)
    d = start_holdfast("--tls-cert", str(cert), "--tls-key", str(key), base=DLOCK_ONLY,
                       want=("dlock",))
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ca.configure_trust(ctx)
        with holdfast.Client([dlock_addr(d)], ssl_context=ctx) as c:
            w = c.watch("tls")
            with c.lock("tls", lease=0.6, value=b"v") as held:
                time.sleep(1.2)
                assert not held.lost.is_set()
                assert c.get("tls").holders[0].fence == held.fence
            assert w.next(SOON_S).kind == "acquired"
            assert w.next(SOON_S).kind == "released"
            inside, errors = [0], []

            def work():
                try:
                    for _ in range(50):
                        with c.lock("tls/mutex"):
                            inside[0] += 1
                            assert inside[0] == 1
                            inside[0] -= 1
                except Exception as e:
                    errors.append(e)
            ts = [threading.Thread(target=work) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert not errors
        with holdfast.Client([dlock_addr(d)]) as plain:  # no TLS: no answer, the connection ends
            plain.request_timeout = 2.0
            with pytest.raises(holdfast.Error):
                plain.get("tls")
    finally:
        stop_holdfast(d.proc)


# A three-node cluster.

@pytest.fixture
def cluster():
    """Three nodes (test_prometheus's, with its short election and session timeouts), each
    with its dlock address as `addr`."""
    binary = os.environ.get("HOLDFAST_BIN")
    if not binary:
        pytest.fail("HOLDFAST_BIN must name the holdfast binary (make test-clients sets it)")
    tmp = tempfile.mkdtemp(prefix="holdfast-pyclient-cluster-")
    per_node = len(Node.LISTENERS)
    ports = free_ports(3 + 3 * per_node)
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports[:3]))
    nodes = []
    try:
        for i in range(3):
            mine = ports[3 + i * per_node:3 + (i + 1) * per_node]
            n = Node(binary, i + 1, peers, mine, os.path.join(tmp, f"node{i + 1}"), tmp)
            n.addr = f"127.0.0.1:{mine[Node.LISTENERS.index('--dlock')]}"
            nodes.append(n)
        for n in nodes:
            n.start()

        def serving():
            for n in nodes:
                try:
                    with holdfast.Client([n.addr]) as c:
                        c.request_timeout = 2.0
                        c.get("ready")
                except holdfast.Error:
                    return False
            return True
        wait_for("three nodes answering", CLUSTER_START_S, serving)
        yield nodes
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_lease_survives_the_death_of_its_node(cluster):
    c = holdfast.Client([n.addr for n in cluster])
    try:
        lease = 3.0
        held = c.lock("failover", lease=lease, value=b"me")
        first = c._conn.address
        victim = next(n for n in cluster if n.addr == f"{first[0]}:{first[1]}")
        victim.kill9()
        killed = time.monotonic()
        wait_for("the lease moved to another node", 2 * lease,
                 lambda: held._conn is not None and held._conn.alive
                 and held._conn.address != first and time.monotonic() < held.expires)
        moved = time.monotonic() - killed
        survivors = [n.addr for n in cluster if n is not victim]
        with holdfast.Client(survivors) as other:
            info = other.get("failover")
            assert [(h.fence, h.value) for h in info.holders] == [(held.fence, b"me")]
            time.sleep(3 * lease)
            assert not held.lost.is_set(), held.lost_reason
            assert other.check_fence("failover", held.fence)
            with pytest.raises(holdfast.AcquireTimeout):
                other.lock("failover", wait=0)
            held.release()
            assert other.get("failover").holders == ()
        assert moved < lease
    finally:
        c.close()


CANDIDATE = r"""
import json, os, sys, time
import holdfast
servers, name, lease = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
c = holdfast.Client(servers)
e = holdfast.Election(c, "election/cluster", value=name, lease=lease)
def say(**kw):
    kw["t"] = time.monotonic()
    print(json.dumps(kw), flush=True)
say(event="campaigning")
with e.campaign() as term:
    say(event="elected", fence=term.fence)
    while not term.lost.is_set():
        say(event="leading", fence=term.fence)
        time.sleep(0.05)
    say(event="lost", fence=term.fence)
"""


def test_an_election_across_three_processes_with_the_leader_killed(cluster, tmp_path):
    lease = 2.0
    script = tmp_path / "candidate.py"
    script.write_text(CANDIDATE)
    lines = {}
    procs = {}
    lock = threading.Lock()

    def pump(name, proc):
        for line in proc.stdout:
            with lock:
                lines[name].append(json.loads(line))

    servers = [n.addr for n in cluster]
    try:
        for i in range(3):
            name = f"cand-{i}"
            rotated = servers[i:] + servers[:i]
            lines[name] = []
            procs[name] = subprocess.Popen(
                [sys.executable, str(script), ",".join(rotated), name, str(lease)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=pump, args=(name, procs[name]), daemon=True).start()

        def leaders():
            with lock:
                return [n for n, ls in lines.items()
                        if any(x["event"] == "elected" for x in ls) and procs[n].poll() is None]

        terms = []  # (name, fence, elected at, last seen leading)
        killed_at = None
        for round_ in range(2):
            now_leading = wait_for("a leader", lease + 10, lambda: [
                n for n in leaders() if n not in [t[0] for t in terms]])
            assert len(now_leading) == 1, now_leading
            name = now_leading[0]
            with lock:
                elected = next(x for x in lines[name] if x["event"] == "elected")
            if killed_at is not None:
                # A new leader within the lease plus the failover.
                assert elected["t"] - killed_at < lease + 3, elected["t"] - killed_at
            time.sleep(0.5)
            procs[name].send_signal(signal.SIGKILL)  # this PID only
            procs[name].wait(SOON_S)
            killed_at = time.monotonic()
            with lock:
                leading = [x["t"] for x in lines[name] if x["event"] in ("elected", "leading")]
            terms.append((name, elected["fence"], elected["t"], max(leading)))
        last = wait_for("the third leader", lease + 10, lambda: [
            n for n in leaders() if n not in [t[0] for t in terms]])
        with lock:
            elected = next(x for x in lines[last[0]] if x["event"] == "elected")
        assert elected["t"] - killed_at < lease + 3
        terms.append((last[0], elected["fence"], elected["t"], time.monotonic()))
        # Exactly one leader at a time: terms in fence order, each begun after the previous ended.
        assert [t[1] for t in terms] == sorted(t[1] for t in terms)
        assert len({t[1] for t in terms}) == 3
        for prev, nxt in zip(terms, terms[1:]):
            assert nxt[2] > prev[3], (prev, nxt)
        with lock:
            assert not any(x["event"] == "lost" for ls in lines.values() for x in ls)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()  # this PID only
                p.wait()


# The package itself.

def test_the_generated_code_matches_proto_holdfast_proto(tmp_path):
    """protoc of today compiles proto/holdfast.proto (package renamed) into a descriptor that
    must equal, field by field, the one the committed code registers."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    from holdfast._proto import holdfast_v3_pb2
    with open(os.path.join(ROOT, "proto", "holdfast.proto")) as f:
        text = f.read().replace("package dlock;", "package holdfast.v3;")
    name = "holdfast/_proto/holdfast_v3.proto"
    (tmp_path / "holdfast" / "_proto").mkdir(parents=True)
    (tmp_path / name).write_text(text)
    out = tmp_path / "set.pb"
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--descriptor_set_out={out}",
                        str(tmp_path / name)]) == 0
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(
        holdfast_v3_pb2.DESCRIPTOR.serialized_pb)
    assert committed.package == "holdfast.v3" and committed.name == name
    for d in (fresh, committed):
        if d.syntax == "proto2":  # the default, written out by some protoc versions only
            d.ClearField("syntax")
        for m in d.message_type:  # derived from the names, written out by --descriptor_set_out
            for fd in m.field:
                fd.ClearField("json_name")
    for kind in ("message_type", "enum_type"):
        a = {m.name: m for m in getattr(fresh, kind)}
        b = {m.name: m for m in getattr(committed, kind)}
        assert sorted(a) == sorted(b), kind
        for k in a:
            assert a[k] == b[k], f"{kind} {k}:\nproto:\n{a[k]}\ncommitted:\n{b[k]}"
    assert fresh == committed


LOAD_BESIDE = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
other = importlib.import_module(sys.argv[2])
import holdfast
from holdfast._proto import holdfast_v3_pb2 as mine
assert other.DESCRIPTOR.package == "dlock", other.DESCRIPTOR.package
assert mine.Request.DESCRIPTOR.full_name == "holdfast.v3.Request"
assert other.Request(version=2, id=1).SerializeToString()
c = holdfast.Client([sys.argv[3]])
with c.lock("beside") as held:
    assert c.check_fence("beside", held.fence)
c.close()
print("ok")
"""


@pytest.mark.parametrize("proto", ["dlock.proto", "holdfast.proto"])
def test_the_package_loads_beside_a_module_generated_from_dlock_protos(proto, tmp_path, daemon):
    from grpc_tools import protoc
    src = os.path.join(HERE, proto) if proto == "dlock.proto" else \
        os.path.join(ROOT, "proto", proto)
    module = proto.replace(".proto", "")
    with open(src) as f:
        (tmp_path / proto).write_text(f.read())
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        str(tmp_path / proto)]) == 0
    r = subprocess.run([sys.executable, "-c", LOAD_BESIDE, str(tmp_path), f"{module}_pb2",
                        dlock_addr(daemon)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_pip_builds_and_installs_the_package(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(wheels), PACKAGE], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    [wheel] = list(wheels.glob("holdfast-*.whl"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for f in ("__init__.py", "py.typed", "_proto/holdfast_v3_pb2.py", "_proto/holdfast_v3_pb2.pyi"):
        assert (site / "holdfast" / f).exists(), f
    probe = "import holdfast, sys; print(holdfast.__file__); print(holdfast.__version__)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(site)}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    where, version = r.stdout.split()
    assert where.startswith(str(site))
    assert version == holdfast.__version__


def test_the_version_is_the_daemons():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        cargo = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert holdfast.__version__ == cargo


def readme_examples():
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_the_readme_has_examples():
    assert len(readme_examples()) >= 6


@pytest.mark.parametrize("index", range(len(readme_examples())))
def test_a_readme_example_runs(index, daemon, tmp_path):
    code = readme_examples()[index].replace("127.0.0.1:2627", dlock_addr(daemon))
    path = tmp_path / "example.py"
    path.write_text(code)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, f"example {index}:\n{code}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr


def test_the_top_readme_example_runs(daemon):
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = [b for b in re.findall(r"^```sh\n(.*?)^```", f.read(), re.S | re.M)
                  if "import holdfast" in b]
    assert len(blocks) == 1
    [line] = [x for x in blocks[0].splitlines() if x.startswith("python3 ")]
    # python3 of the venv, where the package is installed.
    line = line.replace("127.0.0.1:2627", dlock_addr(daemon)).replace("python3 ", "python3 -I ", 1)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", "-euc", line], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"fencing token \d+\n", r.stdout), r.stdout
