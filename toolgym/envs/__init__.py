"""The environment protocol (`core`, `tools`, `stepping`), the code sessions environments run
model code in (`python_session`), and the built-in environments.

This room imports nothing else of toolgym, and its protocol modules only the standard library
(a sandbox worker in a minimal image hosts environments without pydantic or transformers).
"""
