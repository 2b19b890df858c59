"""The ground floor: what every layer may use and nothing else is under (errors, the retry
policy, the one cache, private local state). Imports nothing of shardfs outside itself."""
