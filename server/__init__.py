"""covey server: grouping, aggregation, strategies, coordinator and simulation."""
