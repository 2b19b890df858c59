# Shared by tests and benchmarks, no sys.path edits: both run from the root (python -m benchmarks.X)
