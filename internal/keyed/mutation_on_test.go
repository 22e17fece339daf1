//go:build mutation

package keyed_test

import "testing"

// realClock skips a real-clock test in a mutation run (`make mutate`, build
// tag mutation): the run tests hundreds of mutants on a busy machine, where
// a timing tolerance missed through load would count a mutant as killed by
// chance. The deterministic tests on virtual time judge the mutants; the
// real-clock tests run in every `make test`. See docs/MUTATION.md.
func realClock(t *testing.T) {
	t.Helper()
	t.Skip("real-clock test: not run in a mutation run (docs/MUTATION.md)")
}
