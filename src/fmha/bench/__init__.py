"""The campaign: FLOP counts, providers, grids, timing, the ledger, sweeps and plots."""
