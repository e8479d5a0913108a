"""Host metrics for estimation vectors (psutil), refreshed by the runtime."""
from __future__ import annotations

import psutil


class HostInfo:
    def __init__(self) -> None:
        self.nb_cpu = psutil.cpu_count() or 1
        self.total_mem = psutil.virtual_memory().total
        psutil.cpu_percent(interval=None)  # prime the counter
        self.tags = {}
        self.refresh()

    def refresh(self) -> dict:
        vm = psutil.virtual_memory()
        self.tags = {"free_cpu": max(0.0, 1.0 - psutil.cpu_percent(interval=None) / 100.0),
                     "free_mem": vm.available, "nb_cpu": self.nb_cpu, "total_mem": self.total_mem}
        return self.tags
