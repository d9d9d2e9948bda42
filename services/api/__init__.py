"""The API service: jobs, job controls, dead letters, domains and traces over HTTP."""
