"""Use cases shared by the CLI, REST and MCP: sweeps, the service layer, adopt, doctor, gc."""
