"""Tests for xfuse.backends."""
