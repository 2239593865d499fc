"""memsvc's MCP server: an agent's memory as tools for Claude Code, IDEs and any MCP client.

One tool registry (``tools``) served by one ``mcp`` SDK server (``server``) over two
transports: stdio (``memsvc mcp``, ``stdio``) and streamable HTTP at ``/mcp`` on the web
server (``http``). Every tool calls the services and selectors the agent API calls, with the
API key's scopes checked as that API checks them.
"""
