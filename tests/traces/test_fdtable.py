"""reserve_fds: the soft open-files limit goes up and the kernel fd table is grown once, up front.

Each case runs in a child process (limits and fd tables are per process); /proc/self/status's
FDSize is the kernel's table size.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, os, resource, sys
    from slogate.traces.fdtable import reserve_fds

    def fdsize():
        for line in open("/proc/self/status"):
            if line.startswith("FDSize:"):
                return int(line.split()[1])

    keep = None
    if len(sys.argv) > 2:  # an fd already open where the table would be grown to
        keep = int(sys.argv[2])
        os.dup2(0, keep)
    before = fdsize()
    limit = reserve_fds(int(sys.argv[1]))
    open_fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
    still = keep is None or os.fstat(keep) is not None
    print(json.dumps({"before": before, "after": fdsize(), "limit": limit,
                      "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "max_fd": open_fds[-1],
                      "kept": still}))
""")


def run(*args: int, soft: int = 1024) -> dict:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True,
                         check=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    return json.loads(out.stdout)


def test_raises_the_soft_limit_and_grows_the_table_once() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    r = run(want, soft=256)
    assert r["before"] < 1024
    assert r["limit"] == r["soft"] == want
    assert r["after"] >= want  # the table already holds the highest allowed fd
    assert r["max_fd"] < 100  # and the probe fd is closed again


def test_an_fd_already_open_at_the_top_is_left_alone() -> None:
    r = run(2048, 2047, soft=2048)
    assert r["kept"] is True
    assert r["max_fd"] == 2047
    assert r["after"] >= 2048
