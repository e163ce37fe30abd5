# holdfast: small named targets; CI calls the same ones (.ci/run).
#   make run    build and start the daemon on its defaults
#   make test   everything the tests need is installed here, then every test runs
#   make lint   rustfmt and clippy, warnings are errors
#   make bench  side-by-side benchmark against memcached and redis-server
#   make fuzz   every cargo-fuzz target for FUZZ_SECONDS each (make fuzz-smoke: 20 s each)
#   make scale  memory per idle connection and per held lock, lease expiry accuracy, at 10k/1M
#   make soak   mixed hostile traffic on all three protocols for SOAK_SECONDS (CI: 60)
#   make owner-ceiling  ops/s of one owner thread at 100% and its instructions per op

CARGO  ?= cargo
# make soak: how long the traffic runs; the daemon's timers are short so that they fire often.
SOAK_SECONDS ?= 600
SOAK_DAEMON_FLAGS ?= --threads 2 --orphan-timeout 200 --dlock-idle-timeout 2000
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Debian packages the tests use: memccapable (libmemcached's conformance tool).
APT_TEST_PACKAGES := libmemcached-tools

.PHONY: owner-ceiling run build release test test-rust test-clients conformance deps deps-apt deps-python lint fmt bench scale soak fuzz fuzz-smoke fuzz-deps clean

run: release
	./target/release/holdfast

build:
	$(CARGO) build --all-targets

release:
	$(CARGO) build --release --bins

test: deps test-rust test-clients conformance

test-rust:
	$(CARGO) test --all-targets

# Real client libraries (pymemcache, python-binary-memcached, protobuf) against the real daemon.
test-clients: deps-python release
	HOLDFAST_BIN=$(CURDIR)/target/release/holdfast $(PY) -m pytest -q tests/clients

# libmemcached's own conformance tool against holdfast.
conformance: deps-apt release
	$(PYTHON) tools/memccapable.py $(CURDIR)/target/release/holdfast

deps: deps-apt deps-python

# Install what is missing, once (a fresh machine has only Rust, gcc, Python and git).
deps-apt:
	@if ! command -v memccapable >/dev/null 2>&1; then \
		echo "installing $(APT_TEST_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TEST_PACKAGES)) >/dev/null; \
	fi

deps-python: $(VENV)/.done

$(VENV)/.done: tests/clients/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/clients/requirements.txt
	touch $@

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# The counter rows compare with yrmcds only when YRMCDS=/path/to/yrmcds names a binary you built
# from cybozu/yrmcds (nothing here builds it); otherwise they run holdfast alone.
bench: release
	@[ -n "$$YRMCDS" ] || echo "bench: set YRMCDS=/path/to/yrmcds to compare the counter rows with yrmcds"
	$(PYTHON) tools/bench.py

# Fuzzing: cargo-fuzz (libFuzzer) on the nightly toolchain; the crate is fuzz/, outside the
# main crate's build. New inputs go to fuzz/work/<target> (not committed); fuzz/corpus/<target>
# is the committed seed corpus (fuzz/seeds.py writes it); crashes land in fuzz/artifacts/.
# No sanitizer (-s none): the fuzzed library has no unsafe code, and ASan would cost speed
# without adding checks; debug assertions and overflow checks stay on (-a). Without a nightly
# (none installed and none downloadable) the stable toolchain builds it with RUSTC_BOOTSTRAP=1,
# which is enough for -s none.
FUZZ_TARGETS := memcache_text memcache_binary lockd dlock connection command counter
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

# The owner thread alone at 100% (no sockets): ops/s and callgrind instructions per op.
owner-ceiling:
	$(CARGO) build --release --example owner_ceiling
	$(PYTHON) tools/owner_ceiling.py target/release/examples/owner_ceiling 16
	$(PYTHON) tools/owner_ceiling.py target/release/examples/owner_ceiling 1

clean:
	$(CARGO) clean
	rm -rf $(VENV)
