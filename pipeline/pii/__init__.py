"""PII detection and redaction on Presidio's pattern recognizers, fast enough for a corpus."""
