"""runwatch."""
