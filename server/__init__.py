"""The compile service: app.py (the Starlette routes), jobs.py (the compile queue and its worker
processes), store.py (bundles and job records on disk). It drives the whole compiler and is imported by
nothing in compiler/ except the CLI's `serve` command."""
