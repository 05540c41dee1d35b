"""Analysis passes over the HLO IR: one module per pass, each dispatching on opcode through a rule table."""
