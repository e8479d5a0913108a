"""Experiments: ``gridrpc experiment ethic`` (fair optional computations).

* :mod:`.ethic` — one scenario on a real local tree, metrics from the event log;
* :mod:`.tree` — the MA and SeD processes of an experiment;
* :mod:`.sim` — the same pure objects on a virtual clock (fast comparisons);
* :mod:`.sim_runtime`, :mod:`.overheads`, :mod:`.sim_run` — the same, with the
  runtime's calibrated overheads (``gridrpc experiment ethic --simulate``);
  :mod:`.sim_validate` compares it with the stored real runs
  (``docs/simulation-ethic.md``);
* :mod:`.sweep`, :mod:`.plots` — the report's sweep, its plots and tables
  (``docs/experiments/optional-computations.md``);
* :mod:`.cli` — the ``experiment`` subcommand.
"""
