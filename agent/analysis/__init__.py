"""What a sweep's records say: evidence, insights and their folds, trials, result tables."""
