"""Where an environment instance lives (local, process, docker): not built yet.

See DESIGN.md; the sandbox issue fills this package in. Today every environment runs in-process.
"""
