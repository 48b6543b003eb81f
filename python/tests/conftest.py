import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def retrace_bin():
    b = os.environ.get("RETRACE_BIN")
    if not b:
        pytest.skip("RETRACE_BIN is not set (ctest sets it)")
    return b


def cli(*args, check=True):
    """Runs the retrace CLI; returns (exit code, stdout, stderr)."""
    p = subprocess.run([retrace_bin(), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"retrace {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def cli_json(*args, check=True):
    code, out, err = cli(*args, check=check)
    return code, json.loads(out)


def run_loop(*args):
    """loop.py in a fresh Python process (a crash kills only it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, os.path.join(HERE, "loop.py"), *map(str, args)], env=env,
                          capture_output=True, text=True)
