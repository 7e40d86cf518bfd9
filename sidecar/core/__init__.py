"""The shared vocabulary: the contract's names, states, the API's shapes, events, the state dir's
layout, careful file writes and what /proc says. Imports nothing else of the package."""
