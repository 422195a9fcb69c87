package status

// SetOutcomeEstimateAbove lowers c's outcomeEstimateAbove, so that a test
// takes the estimate path without filling a million guard rows.
func SetOutcomeEstimateAbove(c *Collector, n int64) { c.estimateAbove = n }
