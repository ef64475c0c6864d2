"""The rows of benchmarks/real_gpu.py, one module per group, each a list of
specs (``*_spec()``) that the run (real_gpu.py) plans, times and tables:

- rows.py: what a row is (Row, Spec, Skip), the pass lines' figures, and
  how a cell reads;
- bench.py: what every row runs with (Bench: the clean environment, the C
  client, processes under the row's budget, OutOfTime past it);
- driver_view.py: the driver as the node sees it (NVML without the shim);
- memory.py, tools.py, share.py, priority.py, programs.py, costs.py, node.py:
  the groups, in the table's order.
"""
