"""From trajectories to a policy-gradient update (GRPO, RLOO): not built yet.

See DESIGN.md; the algorithms issue fills this package in.
"""
