"""workers/commands."""
