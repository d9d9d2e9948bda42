"""The storer: writes items, task state, attempt history and dead letters to the store."""
