"""The fetcher: fetches tasks that hold a permit, and routes each outcome onwards."""
