"""dist/prometheus/alerts.yml and dist/grafana/holdfast.json against the real thing.

1. `promtool check rules` and `promtool test rules` (dist/prometheus/alerts_test.yml: for each
   alert, series that fire it and series that do not).
2. A three-node cluster on loopback, scraped every second by Debian's `prometheus` server
   (`make deps-prometheus` installs it; the test skips, saying so, without it) with the repo's
   alert rules, evaluated every second. The production `for:` durations (15 s to 10 min) are
   too long for a test: Prometheus loads a copy of alerts.yml, made here, with every `for:` set
   to FOR_IN_TEST; the expressions are the repo's, unchanged.
   - Every metric name in the dashboard's and the rules' expressions is in a node's /metrics;
     every dashboard expression (its variables filled in) is valid PromQL that Prometheus
     answers with data; every rule loads and evaluates without error.
   - The leader is killed (SIGKILL, by PID): Prometheus sees the survivors' leader id change to
     one of them, and HoldfastNodeDown and HoldfastPeerUnreachable fire for the killed node;
     restarted on its data directory, the alerts resolve.
Every process is started here and stopped by its PID; everything is bounded in time.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
ALERTS = os.path.join(ROOT, "dist", "prometheus", "alerts.yml")
ALERTS_TEST = os.path.join(ROOT, "dist", "prometheus", "alerts_test.yml")
DASHBOARD = os.path.join(ROOT, "dist", "grafana", "holdfast.json")
ELECTION_MS = 300
SESSION_MS = 900
# Every `for:` of the rules, in the copy Prometheus loads here.
FOR_IN_TEST = "2s"
# How long a node or Prometheus may take to serve, and a step of the test to be seen.
START_S = 15
STEP_S = 20
HTTP_TIMEOUT_S = 5


def need(tool):
    path = shutil.which(tool)
    if not path:
        pytest.skip(f"{tool} not installed (Debian's prometheus package; make deps-prometheus installs it)")
    return path


def test_promtool_checks_and_unit_tests_the_alert_rules():
    promtool = need("promtool")
    for args in (["check", "rules", ALERTS], ["test", "rules", ALERTS_TEST]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"
        assert "SUCCESS" in r.stdout, r.stdout


def test_the_dashboard_is_grafana_json():
    d = json.load(open(DASHBOARD))
    assert d["title"] == "holdfast" and 36 <= d["schemaVersion"] <= 40
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in panels(d):
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]


def panels(d):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs():
    d = json.load(open(DASHBOARD))
    return [t["expr"] for p in panels(d) for t in p.get("targets", [])]


def rule_exprs():
    """The `expr:` of every rule (one line, or a `|` block)."""
    exprs = []
    lines = open(ALERTS).read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2) != "|":
            exprs.append(m.group(2))
            continue
        block = []
        for more in lines[i + 1:]:
            if more.strip() and len(more) - len(more.lstrip()) <= len(m.group(1)):
                break
            block.append(more.strip())
        exprs.append(" ".join(block))
    return exprs


def free_ports(n):
    """n distinct loopback ports, free when asked (held open together so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_get(url):
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
        return r.read().decode()


def wait_until(what, within, probe):
    """Call probe() until it returns something truthy (exceptions count as not yet)."""
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        try:
            got = probe()
            if got:
                return got
            last = got
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {within} s (last: {last!r})")


class Node:
    LISTENERS = ("--memcache", "--lockd", "--dlock", "--counter", "--admin")

    def __init__(self, binary, node_id, peers, ports, data_dir, log_dir):
        """ports: one per LISTENERS, chosen here rather than by the kernel, so that no node's
        listener can take a port another process of the test was given."""
        self.args = [binary, "--node-id", str(node_id), "--peers", peers, "--data-dir", data_dir,
                     "--election-timeout", str(ELECTION_MS), "--session-timeout", str(SESSION_MS),
                     "--threads", "1"]
        for flag, port in zip(self.LISTENERS, ports, strict=True):
            self.args += [flag, f"127.0.0.1:{port}"]
        admin_port = ports[-1]
        self.id = node_id
        self.admin = f"127.0.0.1:{admin_port}"
        self.log = os.path.join(log_dir, f"node{node_id}.log")
        self.proc = None

    def start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)  # this PID only
        self.proc.wait(START_S)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(START_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def metrics(self):
        return http_get(f"http://{self.admin}/metrics")


def prometheus_ready(setup, log_path):
    """Prometheus answers /-/ready; if it has exited, fail at once with its log."""
    if setup.prom_proc.poll() is not None:
        with open(log_path) as log:
            pytest.fail(f"prometheus exited ({setup.prom_proc.returncode}):\n{log.read()[-4000:]}")
    return http_get(f"{setup.prom_url}/-/ready")


class Setup:
    def __init__(self, nodes, prom_url, prom_proc, tmp):
        self.nodes, self.prom_url, self.prom_proc, self.tmp = nodes, prom_url, prom_proc, tmp

    def api(self, path, **params):
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            body = json.loads(http_get(f"{self.prom_url}/api/v1/{path}{q}"))
        except urllib.error.HTTPError as e:
            if e.code == 400:  # a bad expression: no use asking again
                pytest.fail(f"prometheus refused {params}: {e.read().decode()}")
            raise
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def by_node(self, expr):
        """{node id: value} of an instant query over the three targets."""
        return {int(r["metric"]["node"]): float(r["value"][1]) for r in self.query(expr)}

    def alerts(self, name, state="firing"):
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]


@pytest.fixture(scope="module")
def cluster():
    prometheus = need("prometheus")
    binary = os.environ.get("HOLDFAST_BIN")
    if not binary:
        pytest.fail("HOLDFAST_BIN must name the holdfast binary (make test-clients sets it)")
    tmp = tempfile.mkdtemp(prefix="holdfast-prometheus-")
    per_node = len(Node.LISTENERS)
    ports = free_ports(1 + 3 + 3 * per_node)
    prom_port, peer_ports, ports = ports[0], ports[1:4], ports[4:]
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(peer_ports))
    nodes = [Node(binary, i + 1, peers, ports[i * per_node:(i + 1) * per_node],
                  os.path.join(tmp, f"node{i + 1}"), tmp)
             for i in range(3)]
    # The repo's rules with the test's `for:` durations.
    rules = open(ALERTS).read()
    rules, n = re.subn(r"^(\s+for:\s*)\S+\s*$", rf"\g<1>{FOR_IN_TEST}", rules, flags=re.M)
    assert n == rules.count("- alert:"), "every rule has a for:"
    with open(os.path.join(tmp, "alerts.yml"), "w") as f:
        f.write(rules)
    targets = "\n".join(f"      - targets: ['{n.admin}']\n        labels: {{node: '{n.id}'}}"
                        for n in nodes)
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: holdfast
    static_configs:
{targets}
""")
    prom_proc = None
    prom_log = os.path.join(tmp, "prometheus.log")
    try:
        with open(prom_log, "w") as log:
            prom_proc = subprocess.Popen(
                [prometheus, f"--config.file={os.path.join(tmp, 'prometheus.yml')}",
                 f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=tmp)
        s = Setup(nodes, f"http://127.0.0.1:{prom_port}", prom_proc, tmp)
        wait_until("prometheus ready", START_S, lambda: prometheus_ready(s, prom_log))
        for n in nodes:
            n.start()
        # Every node scraped, knowing the same leader.
        wait_until("one leader known by the three nodes, through Prometheus", START_S, lambda: (
            len(set((ids := s.by_node("holdfast_cluster_leader_id")).values()) - {0.0}) == 1
            and len(ids) == 3 and 0.0 not in ids.values()))
        yield s
    finally:
        if prom_proc and prom_proc.poll() is None:
            prom_proc.terminate()  # this PID only
            try:
                prom_proc.wait(START_S)
            except subprocess.TimeoutExpired:
                prom_proc.kill()
                prom_proc.wait()
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_dashboard_and_rule_metrics_exist_and_every_panel_has_data(cluster):
    exposed = set()
    for line in cluster.nodes[0].metrics().splitlines():
        if line and not line.startswith("#"):
            exposed.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    dash = dashboard_exprs()
    rules = rule_exprs()
    assert len(rules) == 7, rules
    for expr in dash + rules:
        for name in re.findall(r"\bholdfast_[a-z0-9_]+", expr):
            assert name in exposed, f"{name} (in {expr!r}) is not in a node's /metrics"
    # Every rule loaded, evaluated, healthy.
    def rules_healthy():
        rs = [r for g in cluster.api("rules")["groups"] for r in g["rules"]]
        return len(rs) == 7 and all(r["health"] == "ok" and r["lastEvaluation"][:4] != "0001"
                                    for r in rs) and rs
    wait_until("every rule evaluated without error", STEP_S, rules_healthy)
    # Every panel's expressions, as Grafana sends them with every job and instance chosen.
    for expr in dash:
        filled = (expr.replace("$__rate_interval", "5s").replace("$job", "holdfast")
                  .replace("$instance", ".*"))
        wait_until(f"data for {filled}", STEP_S, lambda: cluster.query(filled))


def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def native_frame(request_id, req_type, key, release_micro=None):
    """A version-3 dlock request (proto/holdfast.proto), framed: enough protobuf for the
    dashboard's traffic, written out so that this test needs no generated code."""
    lock = b"\x1a" + varint(len(key)) + key
    if release_micro is not None:
        lock = b"\x10" + varint(release_micro) + lock
    body = (b"\x08\x03" + b"\x10" + varint(request_id) + b"\x20" + varint(req_type)
            + b"\x9a\x03" + varint(len(lock)) + lock)
    return len(body).to_bytes(4, "big") + body


def test_the_watch_panels_show_a_watchers_events_and_a_holders_loss_notice(cluster):
    """Watch traffic through the dashboard's own expressions: a watcher on node 1 sees a lease
    taken on node 2 end (Expired), and node 2 sends its holder the loss notice. Every node
    applies the Watch, but only node 1 keeps it and counts its events."""
    watch_node, hold_node = cluster.nodes[0], cluster.nodes[1]
    port = lambda n: int(n.args[n.args.index("--dlock") + 1].rsplit(":", 1)[1])
    watcher = socket.create_connection(("127.0.0.1", port(watch_node)), timeout=STEP_S)
    holder = socket.create_connection(("127.0.0.1", port(hold_node)), timeout=STEP_S)
    try:
        watcher.sendall(native_frame(1, 5, b"dashboard-key"))  # Watch
        assert len(watcher.recv(4096)) > 4, "the Watch is answered"
        # Lock with a 300 ms lease, never unlocked: Acquired, then Expired, and a notice.
        holder.sendall(native_frame(1, 2, b"dashboard-key", release_micro=300_000))
        assert len(holder.recv(4096)) > 4, "the Lock is answered"
        sel = '{job="holdfast",node="%s"}'
        exprs = {e.replace("$__rate_interval", "1m").replace("$job", "holdfast")
                 .replace("$instance", ".*") for e in dashboard_exprs() if "dlock" in e}
        assert len(exprs) == 7, exprs
        for n in (watch_node, hold_node):
            wait_until(f"node {n.id} scraped", STEP_S,
                       lambda: cluster.query("holdfast_dlock_watches" + sel % n.id))
        wait_until("one watch on node 1, none on node 2", STEP_S, lambda: cluster.by_node(
            "holdfast_dlock_watches") == {1: 1.0, 2: 0.0, 3: 0.0})
        wait_until("Expired events written on node 1 only", STEP_S, lambda: cluster.by_node(
            'holdfast_dlock_watch_events_total{kind="expired"}') == {1: 1.0, 2: 0.0, 3: 0.0})
        wait_until("a loss notice sent by node 2 only", STEP_S, lambda: cluster.by_node(
            "holdfast_dlock_loss_notices_total") == {1: 0.0, 2: 1.0, 3: 0.0})
        # The events panel's own expression sees them on node 1 only.
        events = next(e for e in exprs if "watch_events_total" in e)
        wait_until("the events panel shows node 1's acquired and expired", STEP_S, lambda: {
            r["metric"]["kind"] for r in cluster.query(f"({events}) > 0")} >= {"acquired",
                                                                             "expired"})
    finally:
        watcher.close()
        holder.close()


def test_a_killed_leader_is_replaced_alerted_on_and_resolved_after_its_restart(cluster):
    started = time.monotonic()
    ids = cluster.by_node("holdfast_cluster_leader_id")
    leader = int(next(iter(ids.values())))
    assert set(ids.values()) == {float(leader)}, ids
    killed = cluster.nodes[leader - 1]
    survivors = [n.id for n in cluster.nodes if n is not killed]
    killed.kill9()

    def new_leader():
        now = cluster.by_node("holdfast_cluster_leader_id")
        got = {now.get(i) for i in survivors}
        return len(got) == 1 and got.pop() in {float(i) for i in survivors}
    wait_until("the survivors' leader id, through Prometheus, names one of them", STEP_S, new_leader)

    def alerted():
        down = [a for a in cluster.alerts("HoldfastNodeDown") if a["node"] == str(leader)]
        unreachable = {a["node"] for a in cluster.alerts("HoldfastPeerUnreachable")
                       if a["peer"] == str(leader)}
        return down and unreachable == set(map(str, survivors))
    wait_until("HoldfastNodeDown and HoldfastPeerUnreachable firing for the killed node",
               STEP_S, alerted)
    assert cluster.alerts("HoldfastNodeDown")[0]["severity"] == "critical"

    killed.start()

    def resolved():
        active = [a["labels"] for a in cluster.api("alerts")["alerts"]
                  if a["labels"]["alertname"] in ("HoldfastNodeDown", "HoldfastPeerUnreachable")]
        return not active and cluster.by_node("up") == {1: 1.0, 2: 1.0, 3: 1.0}
    wait_until("the alerts resolved after the restart", STEP_S, resolved)
    assert time.monotonic() - started < 60
