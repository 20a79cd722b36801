"""Offline simulations of speculative inference: `specchat simulate dsi` (the DSI paper's Figure 1)."""
