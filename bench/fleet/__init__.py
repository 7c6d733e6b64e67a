"""A discrete-event simulation of the GPU fleet at the design's scale (issue 14, `python -m bench.fleet`).

Replicas run on step-time curves (measure.py, step_curve.py), traffic follows a daily curve with bursts
(traffic.py), the edge admits by tier with the reserved paid share (edge_queue.py, limits.py), and the
GPU group scales exactly as iac/ configures it (terraform.py reads the numbers, autoscaler.py plays
AWS's policies on them). SimPy runs the clock.
"""
