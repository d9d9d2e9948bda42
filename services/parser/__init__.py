"""The parser: extracts fields from fetched pages by the job's spec."""
