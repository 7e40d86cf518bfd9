"""One module per group of figures; each exposes `NAMES` (the figure keys it produces, so a
failed group still shows up) and `run(ctx) -> list[Figure]`."""
