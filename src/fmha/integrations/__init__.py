"""Adapters that let other libraries call fmha."""
