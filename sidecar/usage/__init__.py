"""What the agent spends: each model request as its CLI reports it (OTLP/HTTP logs to the
sidecar), priced by the CLI or a pinned table, summed per model, per CLI run and since the start,
kept across a crash; and the budget that stops it.
"""
