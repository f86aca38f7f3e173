"""Clusters: many engine replicas in one SimPy environment behind a router (docs/architecture.md).

config.py    the scenario's ``cluster:`` schema
routers.py   the global scheduler: which replica gets a request
replica.py   one replica's parts, built from the scenario (and a pool's overrides)
link.py      the KV-transfer link of disaggregated prefill/decode
runner.py    run_cluster: the arrival process, the handoffs, the results
results.py   per-replica table and the summary's ``cluster`` block
capacity.py  the fewest replicas (or the highest rate) meeting SLOs
"""
