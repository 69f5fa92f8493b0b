"""Planning: from one joint graph's facts to the Plan it runs with (decisions,
candidates, the budget's choice)."""
