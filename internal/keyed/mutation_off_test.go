//go:build !mutation

package keyed_test

import "testing"

// realClock marks a test that measures the real clock with a tolerance. It
// runs in every ordinary test run; `make mutate` builds with the mutation
// tag, where it is skipped (mutation_on_test.go).
func realClock(t *testing.T) { t.Helper() }
