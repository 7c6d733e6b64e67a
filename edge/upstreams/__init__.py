"""The edge's handles on replicas, one `Upstream` each (the contract: gpu_container/contract.py).

A replica is a GPU-side server that generates tokens; an upstream is the edge's connection to one.
The local CPU engine (its front is an upstream itself, gpu_container/engine/front.py; local_pool.py
starts `engine.replicas` of them), Triton over gRPC (triton.py), and the Triton hosts of an Auto
Scaling group (asg_resolver.py finds them, replica_discovery.py keeps the edge's replicas equal to
them, triton_fleet.py wires the two).
"""
