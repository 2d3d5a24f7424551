"""stream_processors."""
