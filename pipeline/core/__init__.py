"""What every stage shares: errors, the cross-stage documents and their one validator per rule, paths."""
