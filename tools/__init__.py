"""Development tools, not part of the installed product: local Ray port picking, run agreement checks."""
