"""The one engine: slots, the loop, one attempt, the incumbent, recovery, timed starts."""
