"""The environment kernel: the protocol (`core`, `tools`, `calls`, `protocol`), the stepping
layer every backend plays through (`stepping`, with one episode's state in `episode_state`),
inline steps (`inline`), tool functions and their docstrings (`functions`, `docstrings`), rows
and seeds (`rows`, `seeding`).

The environments toolgym ships live in `toolgym.builtin_envs`, the MCP and OpenEnv adapters in
`toolgym.adapters`, the code session model code runs in in `toolgym.sandbox.python_session`.
This room imports nothing else of toolgym, and its protocol modules only the standard library
(a sandbox worker in a minimal image hosts environments without pydantic or transformers).
"""
