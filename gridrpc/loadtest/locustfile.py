"""The locustfile run by ``gridrpc loadtest``: one user class configured from
the environment (GRIDRPC_MA, GRIDRPC_MIX, GRIDRPC_ARGS, ... — see
:mod:`gridrpc.loadtest.config`)."""
from gridrpc.loadtest.user import GridRPCUser


class GridUser(GridRPCUser):
    pass
