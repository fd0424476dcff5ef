"""The MCP interface for coding agents: the tools, the stdio/HTTP server, the HTTP mount."""
