"""`scripts/bench`: the sidecar's performance and load figures, each beside a baseline measured
in the same run (interleaved A B A B ...), reported as median and spread.

Speed is asserted here and never in a timed unit test; `tests/test_bench.py` only checks that
`scripts/bench --quick` still produces every figure.
"""
