package throttler_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) {
	// The recipe tests run this binary as the nats command line tool.
	if filepath.Base(os.Args[0]) == "nats" {
		os.Exit(natsCLI(os.Args[1:], os.Stderr))
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// throttlerBinary is the throttler binary that the recipes run, built
// once for every test package that runs it (testenv.ThrottlerBinary).
func throttlerBinary(t *testing.T) string {
	t.Helper()
	return testenv.ThrottlerBinary(t)
}
