"""`slogate demo`, one module per job: main (the subcommand and its steps in order), steps (each
step's work, reusing slogate's own subcommands), procs (child processes), live (what the user sees).

Holds no metric logic: every number it shows comes from replay, compare or the gateway.
"""
