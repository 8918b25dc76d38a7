"""`slogate plan`: from one captured trace to "which GPU, which flags, how many replicas, what it costs".

candidates (parse + grid) → feasibility (memory) → capacity (bisection in virtual time) → cost
(replicas, USD per good token) → output (table, plan.json). Never runs a live server.
"""
