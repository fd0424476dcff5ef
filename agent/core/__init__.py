"""The loop's vocabulary: domain types, errors, ports, target config, diffs. Pure."""
