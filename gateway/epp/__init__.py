"""slogate as an Endpoint Picker (EPP): Envoy's ext_proc gRPC protocol in front of the gateway's own
routing, stream observer, record assembly, metrics, status and capture.

Envoy carries the bytes; this package only decides where a request goes and measures what comes back.
It never re-implements a part the gateway has: it calls the router, the observer and the recorder.
"""
