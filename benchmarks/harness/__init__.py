"""The benchmarks' harness: what every workload in `benchmarks/` shares.

  machine   the machine, the packages and the revision a run measured
  results   the JSON result a run writes (schema: benchmarks/results/SCHEMA.md), its
            tables and the `Spread` of repeated figures (median, range, n)
  runs      signals that never lose a daemon, repetitions in rotated order, paired ratios
  caches    dropping and warming the kernel's caches, page-cache residency
  procs     a process's CPU, memory and scheduling from /proc
  daemons   the data directory, shardfs mounts (plain, cold, counted), floor daemons
  floors    the pyfuse3 floors: daemons whose handlers do nothing (a CLI too)
  datasets  the data sets more than one workload reads
  writers   writing an array in a writer process of its own (zarr-python 3 or 2.18)

Benchmarks run as modules from the project's root (`python -m benchmarks.NAME`), so that
`benchmarks.harness` and `tests.support` import with no sys.path edit.
"""
