"""Open-file room for slogate's long-running servers (gateway, sim), sized once at startup.

Linux grows a process's file-descriptor table by doubling when a new fd number does not fit (at
256, 512, 1024, …), and in a multi-threaded process (the trace writer, libuv's worker pool) each
growth waits for an RCU grace period inside accept()/socket(): the event loop stood still for
5–15 ms at the 256th and 512th connection here, and every token due meanwhile was late. Growing the
table once before serving (dup2 onto the highest fd we will allow, then close it; the table never
shrinks) moves that wait to startup. The soft RLIMIT_NOFILE is raised to the hard limit first, as
servers do, so that thousands of concurrent streams do not fail with EMFILE.
"""

from __future__ import annotations

import os
import resource

MAX_FDS = 65536  # table size reserved at most: 512 KiB of kernel memory


def reserve_fds(want: int = MAX_FDS) -> int:
    """Raise the soft open-files limit toward `want` and pre-size the fd table; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    top = min(want, soft if soft != resource.RLIM_INFINITY else want) - 1
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        if top > fd and not _is_open(top):  # an open fd there means the table is that big already
            try:
                os.dup2(fd, top)  # grows the table to hold `top`; it stays that size
            except OSError:
                return soft
            os.close(top)
    finally:
        os.close(fd)
    return soft


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
