"""The environments toolgym ships, registered by name in `toolgym.registry`: `Wordle-v0`
(`wordle`, its word lists in `data/`), `Arithmetic-v0`, `GuessNumber-v0`, `PythonREPL-v0` and
`PythonLines-v0` (model code in a `toolgym.sandbox.python_session`), and the reasoning-gym tasks
(`reasoning_gym`, registered lazily under `reasoning-gym/...`).

A sandbox worker imports these modules inside minimal images: they use the standard library,
the environment kernel (`toolgym.envs`) and the code session only.
"""
