"""The model side of an episode (chat rendering, parsers, engines, rollouts): not built yet.

See DESIGN.md; the agents issue fills this package in.
"""
