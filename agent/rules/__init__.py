"""Pure decisions: admission, crash classes, keep rule, gates, noise, contract, knob space."""
