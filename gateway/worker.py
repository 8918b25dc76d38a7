"""One worker process of `slogate gateway --workers N`: `python -m slogate.gateway.worker START_FILE`.

Reads the config and its role from the file the supervisor wrote (gateway/workers.py) and runs the
ordinary per-process server with that role. Exit 2 on a usage error (the supervisor then stops
instead of restarting). Never opens the admin TCP port (the supervisor does).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import msgspec

from slogate.gateway.worker_role import WorkerStart
from slogate.traces.runtime import die_with_parent
from slogate.traces.usage import UsageError


def main(argv: list[str]) -> int:
    parent = os.getppid()
    die_with_parent()  # SIGTERM (a drain) when the supervisor dies, so no worker is left serving without one
    start = msgspec.json.decode(Path(argv[0]).read_bytes(), type=WorkerStart)
    from slogate.gateway.cli import _run
    from slogate.gateway.logs import setup_logging
    from slogate.gateway.server import serve

    setup_logging(start.log_level, fmt=start.config.log_format)
    try:
        _run(serve(start.config, role=start.role))
    except UsageError as exc:
        print(f"slogate gateway worker {start.role.index}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if _gone(parent):  # the supervisor died: nobody else removes its runtime directory
            shutil.rmtree(Path(start.role.state_path).parent, ignore_errors=True)
    return 0


def _gone(parent: int) -> bool:
    """The supervisor exited: this worker was re-parented, or the supervisor is a zombie (killed,
    its other threads still exiting, so the re-parenting has not happened yet)."""
    if os.getppid() != parent:
        return True
    try:
        status = Path(f"/proc/{parent}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status or "\nState:\tX" in status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
