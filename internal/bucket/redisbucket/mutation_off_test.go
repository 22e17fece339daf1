//go:build !mutation

package redisbucket_test

import "testing"

// sameCodeAsTestConformance runs the test: see mutation_on_test.go.
func sameCodeAsTestConformance(*testing.T) {}
