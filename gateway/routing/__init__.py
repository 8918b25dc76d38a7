"""Routing across several upstreams: pools, policies, health, retries and admission (DESIGN §4).

The gateway talks to `Router` only (router.py); everything here is optional with one upstream.
"""
