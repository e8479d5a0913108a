"""Services useful on a batch SeD (``gridrpc.sed.batch.services:job_info``)."""
from __future__ import annotations

import os
import socket

META_VARIABLES = ("GRIDRPC_JOB_ID", "GRIDRPC_NODELIST", "GRIDRPC_NODEFILE", "GRIDRPC_NB_NODES",
                  "GRIDRPC_NB_TASKS", "GRIDRPC_CPUS_PER_TASK", "GRIDRPC_CALL_ID", "GRIDRPC_SERVICE",
                  "GRIDRPC_CALL_DIR")


def job_info(sleep: float = 0.0) -> dict:
    """Where and how the call ran: the job's meta variables (node list, number
    of nodes and tasks...), host name, working directory, and the node file's
    content. Sleeps ``sleep`` seconds first (tests of long jobs)."""
    if sleep > 0:
        import time
        time.sleep(sleep)
    info = {k: os.environ.get(k) for k in META_VARIABLES}
    info["host"] = socket.gethostname()
    info["cwd"] = os.getcwd()
    info["nodes"] = (info["GRIDRPC_NODELIST"] or "").split()
    nodefile = info["GRIDRPC_NODEFILE"]
    try:
        with open(nodefile or "") as fh:
            info["nodefile"] = fh.read().split()
    except OSError:
        info["nodefile"] = None
    return info
