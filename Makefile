# holdfast: small named targets; CI calls the same ones (.ci/run).
#   make run    build and start the daemon on its defaults
#   make test   everything the tests need is installed here, then every test runs
#   make lint   rustfmt and clippy, warnings are errors
#   make bench  side-by-side benchmark against memcached and redis-server
#   make bench-load  latency under load: a bulk writer beside a lock probe (also the end of make bench)
#   make bench-clients  the client libraries: Python vs redis-py's Lock on Redis 7 (goal: >= 1.0x its
#               pairs/s from 1 thread, >= 1.5x from 16), Rust vs the raw protocol (within 20% at depth 1)
#   make bench-cluster  3-node holdfast cluster vs 3-node etcd, leader failover, memory per lock
#   make bench-cluster-state  a cluster at 1 GiB of items / 5M locks: stalls, leader changes, catch-up
#   make fuzz   every cargo-fuzz target for FUZZ_SECONDS each (make fuzz-smoke: 20 s each)
#   make scale  memory per idle connection and per held lock, lease expiry accuracy, at 10k/1M
#   make soak   mixed hostile traffic on all three protocols for SOAK_SECONDS (CI: 60)
#   make soak-cluster  the same against three nodes with kills, pauses and partitions
#   make soak-cluster-tls  the cluster soak with mutual TLS between the nodes
#   make owner-ceiling  ops/s of one owner thread at 100% and its instructions per op
#   make determinism  the replay/determinism check over REPLAY_SEEDS seeds (release)
#   make install  the daemon, holdfast-lock, the systemd units and the man page under DESTDIR/PREFIX
#   make verify-service  systemd-analyze verify of dist/holdfast.service and dist/holdfast@.service (and an install test)
# docs/development.md describes the tests, soak, cluster simulator, fuzzing and scale runs;
# docs/benchmarks.md the benchmarks and their figures.

CARGO  ?= cargo
# make soak: how long the traffic runs; the daemon's timers are short so that they fire often.
SOAK_SECONDS ?= 600
SOAK_DAEMON_FLAGS ?= --threads 2 --orphan-timeout 200 --dlock-idle-timeout 2000
# make soak-cluster: every node's flags (short timers, so that faults and expiries happen often).
SOAK_CLUSTER_FLAGS ?= --threads 1 --election-timeout 300 --session-timeout 900 --orphan-timeout 200 --dlock-idle-timeout 2000
# make soak-cluster: MiB of 1,000-byte items written through the nodes before the clients and the
# faults start (not counted in SOAK_SECONDS), so that snapshots, compaction and snapshot
# transfers to restarted or cut-off nodes happen on a real state; read back on every node at the
# end. The nodes get --memory 4 x this (at least 1024) unless SOAK_CLUSTER_FLAGS gives one.
SOAK_FILL_MB ?= 200
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Debian packages the tests use: memccapable (libmemcached's conformance tool), openssl
# (s_client's handshake with the TLS listeners, tests/clients/test_tls.py).
APT_TEST_PACKAGES := libmemcached-tools openssl
# Debian packages of the admin page's browser test (tests/clients/test_admin.py).
APT_BROWSER_PACKAGES := chromium chromium-driver
# Debian packages of docs/clients.md's Go example (tests/clients/test_docs.py builds it offline
# against the packaged gomemcache in /usr/share/gocode).
APT_GO_PACKAGES := golang-go golang-github-bradfitz-gomemcache-dev
GOMEMCACHE_SRC  := /usr/share/gocode/src/github.com/bradfitz/gomemcache/memcache
# Debian package of `ip`: tests/auth.rs makes a network namespace and a veth pair to send admin
# requests from a non-loopback address (skipped, saying so, without it or without root).
APT_NETNS_PACKAGES := iproute2
# Debian package of systemd-analyze, for `make verify-service`.
APT_SYSTEMD_PACKAGES := systemd
# Debian package of Prometheus (the server and promtool): tests/clients/test_prometheus.py checks
# dist/prometheus/alerts.yml with promtool and runs it in a real Prometheus against a cluster
# (its own server, on a free loopback port; without recommends: no node exporter).
APT_PROMETHEUS_PACKAGES := prometheus
# Debian package of Redis 7 (the server), for `make bench-clients`.
APT_REDIS_PACKAGES := redis-server
# Debian package of etcd (the server; 3.4 on bookworm), for `make bench-cluster`.
APT_ETCD_PACKAGES := etcd-server
# make install: where, and under which root (packagers set DESTDIR).
PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  := $(PREFIX)/bin
MANDIR  := $(PREFIX)/share/man/man1
UNITDIR ?= $(PREFIX)/lib/systemd/system

.PHONY: run run-cluster build release test test-rust test-clients conformance deps deps-apt deps-browser deps-go deps-systemd deps-python deps-etcd deps-netns deps-prometheus install verify-service lint fmt bench bench-load bench-clients deps-redis deps-bench-clients bench-cluster bench-cluster-state owner-ceiling scale soak soak-cluster soak-cluster-tls fuzz fuzz-smoke fuzz-deps clean

run: release
	./target/release/holdfast

# A three-node cluster on loopback (ports printed; Ctrl-C stops it and removes its data).
run-cluster: release
	tools/run_cluster.sh

build:
	$(CARGO) build --workspace --all-targets

release:
	$(CARGO) build --release --workspace --bins

test: deps test-rust test-clients conformance verify-service

# The integration suites run twice: with the owner on a thread of its own (--threads 2) and run
# to completion inside the one worker (--threads 1).
test-rust:
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --test cluster -- --ignored --test-threads 1
	HOLDFAST_TEST_THREADS=1 $(CARGO) test --tests -- --skip core:: --skip proto::

# Real client libraries (pymemcache, python-binary-memcached, protobuf, gomemcache) against the
# real daemon. docs/clients.md's C example (libyrmcds) runs only when LIBYRMCDS_DIR names a built
# libyrmcds (nothing here builds it); otherwise the test reports it skipped. Prometheus (promtool
# and the server) checks the alert rules and the Grafana dashboard against a real cluster.
test-clients: deps-python deps-browser deps-go deps-prometheus release
	HOLDFAST_BIN=$(CURDIR)/target/release/holdfast $(PY) -m pytest -q tests/clients

# libmemcached's own conformance tool against holdfast.
conformance: deps-apt release
	$(PYTHON) tools/memccapable.py $(CURDIR)/target/release/holdfast

deps: deps-apt deps-browser deps-go deps-systemd deps-python deps-netns deps-prometheus

# Install what is missing, once (a fresh machine has only Rust, gcc, Python and git).
deps-apt:
	@if ! command -v memccapable >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then \
		echo "installing $(APT_TEST_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TEST_PACKAGES)) >/dev/null; \
	fi

deps-browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing $(APT_BROWSER_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_BROWSER_PACKAGES)) >/dev/null; \
	fi

deps-go:
	@if ! command -v go >/dev/null 2>&1 || ! test -d $(GOMEMCACHE_SRC); then \
		echo "installing $(APT_GO_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_GO_PACKAGES)) >/dev/null; \
	fi

deps-netns:
	@if ! command -v ip >/dev/null 2>&1; then \
		echo "installing $(APT_NETNS_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_NETNS_PACKAGES)) >/dev/null; \
	fi

deps-systemd:
	@if ! command -v systemd-analyze >/dev/null 2>&1; then \
		echo "installing $(APT_SYSTEMD_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_SYSTEMD_PACKAGES)) >/dev/null; \
	fi

# Install the release binaries, the units (their ExecStart names $(BINDIR)) and the man page:
# holdfast.service for one node, holdfast@.service for cluster node N (holdfast@N).
install: release
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR) $(DESTDIR)$(UNITDIR)
	install -m 0755 target/release/holdfast target/release/holdfast-lock $(DESTDIR)$(BINDIR)/
	install -m 0644 dist/holdfast.1 $(DESTDIR)$(MANDIR)/holdfast.1
	for u in holdfast.service holdfast@.service; do \
		sed 's|@BINDIR@|$(BINDIR)|g' dist/$$u > $(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done

# Install into a scratch root, check what landed, and have systemd-analyze verify the units there
# (it checks that ExecStart's binary exists, so the installed copy is the one verified).
verify-service: deps-systemd release
	rm -rf target/install-test
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/target/install-test PREFIX=/usr/local
	test -x target/install-test/usr/local/bin/holdfast
	test -x target/install-test/usr/local/bin/holdfast-lock
	test -f target/install-test/usr/local/share/man/man1/holdfast.1
	test -f target/install-test/usr/local/lib/systemd/system/holdfast@.service
	$(PYTHON) tools/verify_service.py target/install-test

deps-prometheus:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
		echo "installing $(APT_PROMETHEUS_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PROMETHEUS_PACKAGES)) >/dev/null; \
	fi

deps-redis:
	@if ! command -v redis-server >/dev/null 2>&1; then \
		echo "installing $(APT_REDIS_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_REDIS_PACKAGES)) >/dev/null; \
	fi

# redis-py (pinned) in the tests' venv, for `make bench-clients`.
deps-bench-clients: deps-redis deps-python $(VENV)/.bench-clients

$(VENV)/.bench-clients: tools/bench_clients.requirements.txt $(VENV)/.done
	$(PY) -m pip install -q --disable-pip-version-check -r tools/bench_clients.requirements.txt
	touch $@

deps-etcd:
	@if ! command -v etcd >/dev/null 2>&1; then \
		echo "installing $(APT_ETCD_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_ETCD_PACKAGES)) >/dev/null; \
	fi

deps-python: $(VENV)/.done $(VENV)/.holdfast-client

$(VENV)/.done: tests/clients/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/clients/requirements.txt
	touch $@

# The Python client library (clients/python), installed as a user would (pip install of the
# checkout's directory), again whenever one of its files changes.
PYCLIENT_FILES := $(wildcard clients/python/*.toml clients/python/*.md clients/python/holdfast/*.py \
	clients/python/holdfast/py.typed clients/python/holdfast/_proto/*.py clients/python/holdfast/_proto/*.pyi)

$(VENV)/.holdfast-client: $(VENV)/.done $(PYCLIENT_FILES)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
		--force-reinstall ./clients/python
	touch $@

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The fuzz crate is outside the workspace (it needs libFuzzer): check that it still compiles
	# against the library (a new request variant must reach its printers too).
	$(CARGO) check --manifest-path fuzz/Cargo.toml --lib --quiet
	# Layers: cluster/ and admin/ never import server/ back, no folder's files import in a circle.
	$(PYTHON) tools/import_circles.py --apart cluster,server --apart admin,server

fmt:
	$(CARGO) fmt --all

# The counter rows compare with yrmcds only when YRMCDS=/path/to/yrmcds names a binary you built
# from cybozu/yrmcds (nothing here builds it); otherwise they run holdfast alone.
bench: release
	$(CARGO) build --release --example null_responder
	@[ -n "$$YRMCDS" ] || echo "bench: set YRMCDS=/path/to/yrmcds to compare the counter rows with yrmcds"
	$(PYTHON) tools/bench.py
	$(PYTHON) tools/bench_load.py

# Latency under load alone (tools/bench_load.py; also the last part of make bench): a bulk writer
# beside a lock probe, holdfast's four lock protocols against memcached -t 1 / -t 4 and Redis;
# the writer unpaced, then paced at one rate for every server. Tuned by LOAD_SECONDS (10),
# LOAD_ROUNDS (3), LOAD_CASES, LOAD_RATES (MB/s; 0,250), LOAD_BYTES (per run; default no limit).
bench-load: release
	$(PYTHON) tools/bench_load.py

# The Python client (one Client shared by the threads) against redis-py's Lock on redis-server,
# lock+unlock pairs/s and p99 from 1 and 16 threads, alternating runs; and, once
# target/release/holdfast-client-bench is built, the Rust client against the raw protocol.
# Tuned by BENCH_SECONDS (3) and BENCH_ROUNDS (3). Not part of make test.
bench-clients: deps-bench-clients release
	$(PY) tools/bench_clients.py

# A three-node holdfast cluster against a three-node etcd cluster on loopback (alternating runs,
# depth 1 and 16, plus one holdfast node at depth 16), then 20 leader kills (time to the first
# grant on a survivor) and memory per held lock, cluster vs single node. Not part of make test.
# Tuned by BENCH_SECONDS (2), BENCH_ROUNDS (3), BENCH_PARTS, FAILOVER_KILLS, MEMORY_LOCKS.
bench-cluster: deps-etcd release
	$(PYTHON) tools/bench_cluster.py

# The large-state part alone (tools/bench_state.py; BENCH_PARTS=state): a cluster filled with
# STATE_BYTES (1G) of 1,000-byte items, beside one node and a 3-node etcd, then STATE_LOCKS
# (5000000) held old-protocol locks, while a probe times TRY+REL on another node every 10 ms;
# a paused follower and a wiped node catching up. STATE_PARTS (items,locks,paused,wiped) picks
# sub-parts. Tens of minutes at full size; STATE_BYTES=100M STATE_LOCKS=500000 is a quick run.
bench-cluster-state: deps-etcd release
	BENCH_PARTS=state $(PYTHON) tools/bench_cluster.py

# Fuzzing: cargo-fuzz (libFuzzer) on the nightly toolchain; the crate is fuzz/, outside the
# main crate's build. New inputs go to fuzz/work/<target> (not committed); fuzz/corpus/<target>
# is the committed seed corpus (fuzz/seeds.py writes it); crashes land in fuzz/artifacts/.
# No sanitizer (-s none): the fuzzed library has no unsafe code, and ASan would cost speed
# without adding checks; debug assertions and overflow checks stay on (-a). Without a nightly
# (none installed and none downloadable) the stable toolchain builds it with RUSTC_BOOTSTRAP=1,
# which is enough for -s none.
FUZZ_TARGETS := memcache_text memcache_binary lockd dlock connection command counter tls_boundary
FUZZ_SECONDS ?= 600
FUZZ_FLAGS   := -s none -a

fuzz-deps:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal \
		|| echo "fuzz: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1"
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

fuzz: fuzz-deps
	cd fuzz && if rustup toolchain list | grep -q '^nightly'; then tc=+nightly; boot=; \
		else tc=; boot=RUSTC_BOOTSTRAP=1; fi; \
	for t in $(FUZZ_TARGETS); do \
		mkdir -p work/$$t && \
		env $$boot cargo $$tc fuzz run $(FUZZ_FLAGS) $$t work/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 || exit 1; \
	done

fuzz-smoke:
	$(MAKE) fuzz FUZZ_SECONDS=20

# 10 000 connections, 1M locks per table, 1M leases of 1-10 s (a few minutes at most).
# SCALE_ARGS passes flags through, e.g. SCALE_ARGS="--phases leases".
scale: release
	./target/release/holdfast-scale $(SCALE_ARGS)
# The soak starts the release daemon (port 0 everywhere), runs ~60 client threads against it,
# waits past every timeout, checks that nothing is left, stops the daemon by its PID.
soak: release
	./target/release/holdfast-soak --seconds $(SOAK_SECONDS) --holdfast ./target/release/holdfast -- $(SOAK_DAEMON_FLAGS)

# The cluster soak: three release nodes on loopback, every peer link through a fault-injecting
# proxy, ~60 client threads spread over the nodes, a fault every few seconds (kill -9 of a node
# or the leader, SIGSTOP past the session timeout, SIGTERM and restart, partitions both ways and
# one way), after a fill of SOAK_FILL_MB MiB of items; then nothing may be left locked on any
# node, and a sample of the fill must be readable on every node. Data and node logs are kept on FAIL.
soak-cluster: release
	./target/release/holdfast-soak --cluster 3 --seconds $(SOAK_SECONDS) --fill-mb $(SOAK_FILL_MB) --holdfast ./target/release/holdfast -- $(SOAK_CLUSTER_FLAGS)

# The same with mutual TLS between the nodes: a CA and a certificate per node are made in the
# soak's directory; the proxies forward the TLS bytes unchanged.
soak-cluster-tls: release
	./target/release/holdfast-soak --cluster 3 --peer-tls --seconds $(SOAK_SECONDS) --fill-mb $(SOAK_FILL_MB) --holdfast ./target/release/holdfast -- $(SOAK_CLUSTER_FLAGS)

# The owner thread alone at 100% (no sockets): ops/s and callgrind instructions per op.
owner-ceiling:
	$(CARGO) build --release --example owner_ceiling
	$(PYTHON) tools/owner_ceiling.py target/release/examples/owner_ceiling 16
	$(PYTHON) tools/owner_ceiling.py target/release/examples/owner_ceiling 1

# The cluster simulator (src/sim/mod.rs) over many seeds in release mode: SIM_SEEDS seeds
# from SIM_FIRST (cargo test runs 200 from 0), first with the Replayer as the machine, then
# with the cluster node's own state (`Replicated`, 100 in cargo test). A failing seed is printed; replay it with
# HOLDFAST_SIM_SEED=N cargo test --lib sim::tests::one_seed -- --ignored --nocapture.
# Half of the seeds change the membership under load; SIM_MEMBERSHIP_ONLY=1 runs only those.
# Then the native protocol's workload (src/sim/native.rs, SIM_NATIVE_SEEDS seeds, the two
# machines in turn; 40 in cargo test), and as many with a watcher (30 in cargo test): replay a
# seed with HOLDFAST_SIM_SEED=N [HOLDFAST_SIM_TRACE=1] cargo test --lib
# sim::tests::one_native_seed (one_watching_seed) -- --ignored --nocapture.
# Then the liveness mode (src/sim/live.rs; 24 seeds in cargo test): replay a seed with
# HOLDFAST_SIM_SEED=N [HOLDFAST_SIM_TRACE=1] cargo test --lib sim::tests::one_live_seed -- --ignored --nocapture.
SIM_SEEDS ?= 100000
SIM_NATIVE_SEEDS ?= $(SIM_SEEDS)
SIM_FIRST ?= 1000
SIM_MEMBERSHIP_ONLY ?= 0
SIM_ENV = HOLDFAST_SIM_FIRST=$(SIM_FIRST) HOLDFAST_SIM_SEEDS=$(SIM_SEEDS) \
	HOLDFAST_SIM_MEMBERSHIP_ONLY=$(SIM_MEMBERSHIP_ONLY)
.PHONY: cluster-sim
cluster-sim:
	$(SIM_ENV) $(CARGO) test --release --lib \
		sim::tests::replicas_of_holdfast_agree_under_faults_100k_seeds -- --ignored --nocapture
	$(SIM_ENV) $(CARGO) test --release --lib \
		sim::tests::replicas_of_the_cluster_state_agree_under_faults_over_many_seeds -- --nocapture
	$(SIM_ENV) HOLDFAST_SIM_NATIVE_SEEDS=$(SIM_NATIVE_SEEDS) $(CARGO) test --release --lib \
		sim::tests::the_native_workload_holds_under_faults_over_many_seeds -- --nocapture
	$(SIM_ENV) HOLDFAST_SIM_WATCH_SEEDS=$(SIM_NATIVE_SEEDS) $(CARGO) test --release --lib \
		sim::tests::a_watcher_sees_every_change_of_its_keys_under_faults -- --nocapture
	$(SIM_ENV) HOLDFAST_SIM_LIVE_SEEDS=$(SIM_SEEDS) $(CARGO) test --release --lib \
		sim::tests::the_liveness_mode_holds_over_many_seeds -- --nocapture

# The determinism replay (tests/invariants.rs) over many seeds in release mode: each schedule's
# command entries replayed under another hash seed with snapshot restores midway.
REPLAY_SEEDS ?= 2000
REPLAY_FIRST ?= 10000
.PHONY: determinism
determinism:
	HOLDFAST_REPLAY_FIRST=$(REPLAY_FIRST) HOLDFAST_REPLAY_SEEDS=$(REPLAY_SEEDS) $(CARGO) test --release \
		--test invariants replays_agree_over_many_seeds -- --ignored --nocapture

clean:
	$(CARGO) clean
	rm -rf $(VENV)
