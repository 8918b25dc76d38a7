"""`slogate plan`: from one captured trace to "which GPU, which flags, how many replicas, what it costs".

candidates (parse + grid) → feasibility (memory) → capacity (bisection in virtual time, early stop)
→ cost (replicas, USD per good token) → scaling (TP steps, interconnect) → output (table, plan.json);
vs_sweep sets a plan beside a measured sweep. Never runs a live server.
"""
