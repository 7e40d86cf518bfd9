"""`python -m sidecar` is the same as the `sidecar` console script."""

from sidecar.main import main

raise SystemExit(main())
