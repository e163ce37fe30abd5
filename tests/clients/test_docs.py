"""Run every example of docs/clients.md against a real daemon (ports substituted), run the
README's protocol examples (its `python3` blocks) the same way, and check that the README's
flags table names every flag of `holdfast --help`.

`python` blocks run with the test's Python, `sh` blocks with bash (holdfast-lock on the PATH),
`go` blocks are built offline against Debian's gomemcache (`make deps-go`) and run, `c` blocks
are built against libyrmcds and run when LIBYRMCDS_DIR names a built cybozu/libyrmcds (the
directory holding yrmcds.h and libyrmcds.a; nothing here builds it), else they are reported
skipped. A line `<!-- holdfast flags: ... -->` right above a block adds those flags to the
daemon that block runs against."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import start_holdfast, stop_holdfast

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "clients.md")
DEFAULT_PORTS = {"memcache": "11211", "lockd": "2626", "dlock": "2627", "counter": "11215",
                 "admin": "2629"}
EXAMPLE_TIMEOUT_S = 30
# Compiling a Go or C example on a busy 2-core machine with a cold build cache takes far longer
# than running it.
BUILD_TIMEOUT_S = 300
BLOCK = re.compile(r"(?:^<!-- holdfast flags: ([^>]*?) -->\n)?^```(python|sh|go|c)\n(.*?)^```",
                   re.S | re.M)
# Where Debian's golang-github-bradfitz-gomemcache-dev puts its source (GOPATH layout).
GOPATH = "/usr/share/gocode"


def examples():
    text = open(DOC).read()
    return [(lang, body, flags.split()) for flags, lang, body in BLOCK.findall(text)]


def test_the_guide_has_examples_of_every_kind():
    langs = [lang for lang, _, _ in examples()]
    assert langs.count("python") >= 6 and "sh" in langs and "go" in langs and "c" in langs
    bodies = "\n".join(body for _, body, _ in examples())
    for client in ("pymemcache", "bmemcached", "gomemcache", "yrmcds_lock", "yrmcds_cnt_acquire",
                   "grpc_tools", "holdfast-lock"):
        assert client in bodies, f"no example uses {client}"


@pytest.fixture(scope="module")
def gocache(tmp_path_factory):
    """One Go build cache for every Go example of the run (the standard library is built once)."""
    return str(tmp_path_factory.mktemp("gocache"))


def build_go(body, workdir, gocache):
    go = shutil.which("go")
    if go is None:
        pytest.fail("no `go` on the PATH: run `make deps-go` (Debian golang-go and gomemcache)")
    with open(os.path.join(workdir, "main.go"), "w") as f:
        f.write(body)
    env = dict(os.environ, GOPATH=GOPATH, GO111MODULE="off", GOCACHE=gocache, GOPROXY="off",
               GOFLAGS="", CGO_ENABLED="0")
    exe = os.path.join(workdir, "main")
    r = subprocess.run([go, "build", "-o", exe, "main.go"], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, f"go build failed:\n{body}\n{r.stdout}\n{r.stderr}"
    return [exe]


def build_c(body, workdir):
    lib = os.environ.get("LIBYRMCDS_DIR")
    if not lib:
        pytest.skip("C example (libyrmcds) not run: set LIBYRMCDS_DIR to a directory holding a "
                    "built cybozu/libyrmcds (yrmcds.h and libyrmcds.a)")
    archive = os.path.join(lib, "libyrmcds.a")
    assert os.path.isfile(archive), f"LIBYRMCDS_DIR={lib} has no libyrmcds.a (run make there)"
    src = os.path.join(workdir, "main.c")
    with open(src, "w") as f:
        f.write(body)
    exe = os.path.join(workdir, "main")
    r = subprocess.run(["gcc", "-Wall", "-Werror", "-I", lib, "-o", exe, src, archive, "-lpthread"],
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, f"gcc failed:\n{body}\n{r.stdout}\n{r.stderr}"
    return [exe]


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index, tmp_path, gocache):
    lang, body, flags = examples()[index]
    base = ["--threads", "2"]
    for name in DEFAULT_PORTS:
        base += [f"--{name}", "127.0.0.1:0"]
    if lang == "c" and not os.environ.get("LIBYRMCDS_DIR"):
        build_c(body, str(tmp_path))  # skips, before a daemon is started
    daemon = start_holdfast(*flags, base=base, want=tuple(DEFAULT_PORTS))
    try:
        for name, port in DEFAULT_PORTS.items():
            body = body.replace(f"127.0.0.1:{port}", "%s:%d" % daemon.addresses[name])
            body = body.replace(f'"127.0.0.1", {port})', '"127.0.0.1", %d)' % daemon.addresses[name][1])
        env = dict(os.environ)
        bindir = os.path.dirname(os.environ["HOLDFAST_BIN"])
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        if lang == "python":
            cmd = [sys.executable, "-c", body]
        elif lang == "sh":
            cmd = ["bash", "-euc", body]
        elif lang == "go":
            cmd = build_go(body, str(tmp_path), gocache)
        else:
            cmd = build_c(body, str(tmp_path))
        r = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                           timeout=EXAMPLE_TIMEOUT_S)
        assert r.returncode == 0, f"example {index} ({lang}) failed:\n{body}\n{r.stdout}\n{r.stderr}"
    finally:
        stop_holdfast(daemon.proc)


README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_the_readme_flags_table_names_every_flag_of_help():
    help_text = subprocess.run([os.environ["HOLDFAST_BIN"], "--help"], capture_output=True,
                               text=True, timeout=EXAMPLE_TIMEOUT_S).stdout
    options = help_text[help_text.index("Options:"):]
    flags = set(re.findall(r"--([a-z][a-z-]+)", options))
    assert len(flags) > 30, help_text
    readme = open(README).read()
    table = readme[readme.index("\n## Flags"):]
    table = table[:table.index("\n## ", 1)]
    documented = set(re.findall(r"`(?:-[a-zA-Z], )?--([a-z][a-z-]+)", table))
    documented |= set(re.findall(r", `--([a-z][a-z-]+)", table))
    assert flags - documented == set(), "flags of --help missing from the README's table"


def readme_python_examples():
    text = open(README).read()
    return [body for lang, body in re.findall(r"^```(sh)\n(.*?)^```", text, re.S | re.M)
            if body.startswith("python3") and "cert.pem" not in body]


def test_the_readme_protocol_examples_run():
    bodies = readme_python_examples()
    assert len(bodies) == 4, "one example per protocol: memcached, old, dlock, counters"
    base = ["--threads", "2"]
    for name in DEFAULT_PORTS:
        base += [f"--{name}", "127.0.0.1:0"]
    daemon = start_holdfast(base=base, want=tuple(DEFAULT_PORTS))
    try:
        outputs = []
        for body in bodies:
            for name, port in DEFAULT_PORTS.items():
                body = body.replace(f'"127.0.0.1", {port})', '"127.0.0.1", %d)' % daemon.addresses[name][1])
            r = subprocess.run(["bash", "-euc", body], capture_output=True, text=True,
                               timeout=EXAMPLE_TIMEOUT_S)
            assert r.returncode == 0, f"README example failed:\n{body}\n{r.stdout}\n{r.stderr}"
            outputs.append(r.stdout.strip())
        assert outputs[0] == "STORED OK TOKEN 1", outputs
        assert outputs[1] == "ACQUIRED", outputs
        assert outputs[2].startswith("status 0 (0: Ok), fencing token "), outputs
        assert outputs[3] == "status 0 consumption 1", outputs
    finally:
        stop_holdfast(daemon.proc)


def test_the_native_protocol_examples_are_what_the_daemon_answers():
    """tools/native_examples.py drives a daemon through docs/protocol.md's worked examples of
    the native protocol (checking each status); every exchange it prints is in the doc as is."""
    here = os.path.dirname(__file__)
    root = os.path.join(here, "..", "..")
    binary = os.environ.get("HOLDFAST_BIN", os.path.join(root, "target", "release", "holdfast"))
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "native_examples.py"),
                          binary], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # Time left (a lock-delay's, a lease's) depends on how busy the machine is: compared as a
    # number, not its value.
    left = re.compile(r"(delayed_micro|lease_left_micro):\d+")
    exchanges = [left.sub(r"\1:N", l.strip()) for l in out.stdout.splitlines()
                 if " -> " in l or " <- " in l]
    assert len(exchanges) > 50, out.stdout
    doc = left.sub(r"\1:N", open(os.path.join(root, "docs", "protocol.md")).read())
    missing = [l for l in exchanges if l not in doc]
    assert not missing, f"exchanges the doc does not show: {missing[:5]}"
