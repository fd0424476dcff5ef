"""overnight: the composition root: the CLI, the Runtime that builds everything, MCP stdio."""
