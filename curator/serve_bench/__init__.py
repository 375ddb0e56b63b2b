"""`curator bench-serve`: the draft measured inside the serving engine (SGLang, vLLM).

client.py sends the requests and times them, curator/engines/ reads each engine's own acceptance
counters, run.py runs a prompt set per category and concurrency against the draft's endpoint and a
baseline, report.py holds the results and the verdict.
"""
