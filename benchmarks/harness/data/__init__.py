"""The data sets more than one workload reads (one module each)."""
