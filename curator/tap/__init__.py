"""`curator tap`: a proxy in front of a serving engine that records a scrubbed sample of its
requests and the target's own answers (docs/tap.md).

`record.py` turns one exchange (the request's bytes, the engine's status and answer bytes) into a
tap record (the v1 contract in docs/tap.md); `writer.py` writes records off the request path into
size-rotated, disk-bounded JSONL files; `proxy.py` is the HTTP/1.1 server that forwards every
request unchanged and hands the sampled exchanges to the writer.
"""
