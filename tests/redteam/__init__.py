"""The red team's findings against the egress guard (issue 29), each a test that fails on the
design they broke and passes now, and further attempts in the same spirit: the agent inside the
sleeve is the attacker. See docs/threat-model.md."""
