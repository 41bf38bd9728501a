"""``python -m ceiling.run.watchdog PGID[,PGID...] OWNER_PID [TOKEN]``: end an engine's group
(or commbench's ranks' groups) when ceiling dies.

Started by the launcher beside each engine (see :mod:`ceiling.run.guard`), in its own session.
It blocks on a pidfd of the owner (Linux >= 5.3; else it polls ``getppid`` once a second), and
checks once a second whether the engine's group still exists: when the group is gone (ceiling
stopped it), it exits; when the owner is gone first, it ends the group (SIGTERM, SIGKILL after
:data:`ceiling.run.guard.KILL_GRACE_S`). Either way, once the group is gone it removes the
server's record (the one holding TOKEN: never a newer server's that got the same PID). It imports nothing heavy.
"""

from __future__ import annotations

import os
import select
import sys

from ceiling.run.guard import end_group, group_members, remove_record


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(pgids: list[int], owner: int) -> str:
    """Block until every group is gone ("group gone") or the owner died ("owner died")."""
    parent = os.getppid()
    try:
        fd: int | None = os.pidfd_open(owner)
    except ProcessLookupError:
        return "owner died"
    except (OSError, AttributeError):  # kernel < 5.3: poll our parent (the owner) instead
        fd = None
        if parent != owner:
            return "owner died"
    while True:
        if fd is not None:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                return "owner died"
        else:
            select.select([], [], [], 1.0)
            if os.getppid() != parent:
                return "owner died"
        if not any(_group_exists(pgid) for pgid in pgids):
            return "group gone"


def main(argv: list[str]) -> int:
    pgids, owner = [int(x) for x in argv[0].split(",")], int(argv[1])
    token = argv[2] if len(argv) > 2 else None
    if watch(pgids, owner) == "owner died":
        for pgid in pgids:  # commbench's ranks: one group each, all ended together
            if group_members(pgid):
                end_group(pgid)
    if len(pgids) == 1 and not group_members(pgids[0]):
        remove_record(pgids[0], token=token)  # gone (ended here, by ceiling, or it died)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
