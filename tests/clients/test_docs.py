"""Run every example of docs/clients.md against a real daemon (ports substituted)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import start_holdfast, stop_holdfast

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "clients.md")
DEFAULT_PORTS = {"memcache": "11211", "lockd": "2626", "dlock": "2627", "counter": "11215",
                 "admin": "2629"}
EXAMPLE_TIMEOUT_S = 30
BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)


def examples():
    text = open(DOC).read()
    return [(lang, body) for lang, body in BLOCK.findall(text)]


def test_the_guide_has_examples_of_every_kind():
    langs = [lang for lang, _ in examples()]
    assert langs.count("python") >= 3 and "sh" in langs


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index):
    lang, body = examples()[index]
    base = ["--threads", "2"]
    for name in DEFAULT_PORTS:
        base += [f"--{name}", "127.0.0.1:0"]
    daemon = start_holdfast(base=base, want=tuple(DEFAULT_PORTS))
    try:
        for name, port in DEFAULT_PORTS.items():
            body = body.replace(f"127.0.0.1:{port}", "%s:%d" % daemon.addresses[name])
            body = body.replace(f'"127.0.0.1", {port})', '"127.0.0.1", %d)' % daemon.addresses[name][1])
        env = dict(os.environ)
        bindir = os.path.dirname(os.environ["HOLDFAST_BIN"])
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        cmd = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euc", body]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
        assert r.returncode == 0, f"example {index} ({lang}) failed:\n{body}\n{r.stdout}\n{r.stderr}"
    finally:
        stop_holdfast(daemon.proc)
