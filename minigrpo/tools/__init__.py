"""What sits on top of the commands: compare's process pool and its helpers."""
