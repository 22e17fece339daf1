//go:build mutation

package redisbucket_test

import "testing"

// sameCodeAsTestConformance skips, in a mutation run (`make mutate`, build
// tag mutation), a test that runs the store's code as another test does
// with another client only (the autopipeliner): it can kill no mutant that
// the other misses, and a mutation run builds and tests the package once
// per mutant. Every `make test` runs it. See docs/MUTATION.md.
func sameCodeAsTestConformance(t *testing.T) {
	t.Helper()
	t.Skip("the store's code as TestConformance runs it, through another client: not run in a mutation run (docs/MUTATION.md)")
}
