"""Builders used by the tests and the demo: the tiny Llasa-shaped model and tokenizer."""
