"""Output writers of a replay run, one module per format: console, csv, json (results.json),
records (requests.jsonl.zst), html (the report). Writers only format; they never compute metrics.
"""
