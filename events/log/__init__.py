"""Log backends behind one interface."""
