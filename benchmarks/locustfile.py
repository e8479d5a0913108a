"""A ready locustfile for gridrpc, for the ``locust`` command itself.

Web UI (open http://127.0.0.1:8089, set users and spawn rate, press start)::

    gridrpc deploy up deployments/local.yaml          # or any tree; its MA address below
    GRIDRPC_MA=tcp://127.0.0.1:5555 locust -f benchmarks/locustfile.py

Headless and bounded (time and requests)::

    GRIDRPC_MA=tcp://127.0.0.1:5555 GRIDRPC_MIX='add:3,sleep:1' GRIDRPC_MAX_REQUESTS=20000 \\
        locust -f benchmarks/locustfile.py --headless -u 16 -r 16 -t 30s --csv out/run

Distributed (a master and two workers on this machine)::

    export GRIDRPC_MA=tcp://127.0.0.1:5555 GRIDRPC_MAX_REQUESTS=20000
    locust -f benchmarks/locustfile.py --master --headless -u 16 -r 16 -t 30s --expect-workers 2 &
    GRIDRPC_MAX_REQUESTS=10000 locust -f benchmarks/locustfile.py --worker &
    GRIDRPC_MAX_REQUESTS=10000 locust -f benchmarks/locustfile.py --worker &
    wait

``gridrpc loadtest`` runs the same user class with all of this set up (and a
deployment file started and stopped around the run). Settings, from the
environment (see ``gridrpc/loadtest/config.py``): GRIDRPC_MA, GRIDRPC_MIX
(``NAME[/call|discover|bound][:WEIGHT],...``), GRIDRPC_ARGS (``{"add": [1, 2]}``),
GRIDRPC_K, GRIDRPC_TIMEOUT, GRIDRPC_WAIT, GRIDRPC_MAX_REQUESTS, GRIDRPC_FAIL_RATIO,
GRIDRPC_SUMMARY. Locust's ``--host`` may give the MA address instead of GRIDRPC_MA.
"""
from gridrpc.loadtest import GridRPCUser


class GridUser(GridRPCUser):
    """Configured from the environment; set class attributes to fix them here,
    e.g. ``mix = "add:3,sleep/bound:1"`` or ``args = {"sleep": [0.05]}``."""
