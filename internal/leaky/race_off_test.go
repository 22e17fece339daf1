//go:build !race

package leaky_test

const raceEnabled = false
