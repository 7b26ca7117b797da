"""Environments served by someone else, adapted to toolgym's stepping layer: an MCP server's tools
(`mcp`, over one client session, `mcp_session`) and an OpenEnv server (`openenv`, with the MCP
tools an OpenEnv server may expose, `openenv_mcp`). Each is an `Executor` under a `Stepper`, so
an adapted server plays, scores and fails as a local environment does.

This room imports only the environment kernel (`toolgym.envs`); the MCP SDK and OpenEnv load on
first use.
"""
