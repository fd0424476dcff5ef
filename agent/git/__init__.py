"""The git adapter: commits without a checkout, worktrees, git's own files, content hashes."""
